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
from pydantic import ValidationError

from omni_serve.api.deadline import RequestTimeout
from omni_serve.api.errors import ApiError, stage_failure
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


def error_event(exc: Exception) -> dict[str, Any]:
    """A request's failure as the error event the socket stays open after: the HTTP routes'
    error body, with the status left out."""
    if isinstance(exc, ApiError):
        return {"type": "error", **exc.body}
    if isinstance(exc, RequestTimeout):
        return {"type": "error", **error_body(str(exc), "timeout_error")}
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return {"type": "error", **error_body(f"{where}: {first['msg']}", param=where)}
    if isinstance(exc, ValueError | KeyError | TypeError):  # incl. JSON decode errors
        return {"type": "error", **error_body(str(exc)[:500])}
    return {"type": "error", **stage_failure(exc).body}
