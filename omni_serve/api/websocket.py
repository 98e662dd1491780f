"""WebSocket session limits: a client that sends no request for ``idle_timeout_s`` is told so
and disconnected.

An open WebSocket holds one of the ingress replica's ``max_ongoing_requests`` slots for as long
as it lives, so idle (or slowloris-style, never-finishing) clients would otherwise lock every
other client out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import WebSocket

from omni_serve.api.protocol import error_body

IDLE_CLOSE_CODE = 1000  # a normal close: the server ended an idle session


class IdleTimeout(Exception):
    pass


async def receive_request(ws: WebSocket, idle_timeout_s: float | None) -> Any:
    """The client's next JSON message; on idle timeout sends an error event, closes the
    socket and raises ``IdleTimeout``."""
    try:
        return await asyncio.wait_for(ws.receive_json(), idle_timeout_s)
    except TimeoutError:
        message = f"no request for {idle_timeout_s:g} s: closing the idle connection"
        await ws.send_json({"type": "error", **error_body(message, code="idle_timeout")})
        await ws.close(IDLE_CLOSE_CODE, "idle timeout")
        raise IdleTimeout from None
