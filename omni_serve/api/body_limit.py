"""Refuse request bodies over ``api.max_request_bytes`` with a 413, before parsing them.

A pure ASGI middleware: a declared ``Content-Length`` over the limit is refused at once; a
body without one (chunked) is counted as it arrives and refused as soon as it passes the
limit, so an oversized upload is never held past the limit.
"""

from __future__ import annotations

import json
from typing import Any

from omni_serve.api.protocol import error_body


class _Limit:
    max_bytes: int | None = None


def configure(max_bytes: int | None) -> None:
    _Limit.max_bytes = max_bytes


async def _refuse(send: Any, limit: int) -> None:
    message = f"request body is larger than this server accepts ({limit} bytes)"
    body = json.dumps(error_body(message, code="request_too_large")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = _Limit.max_bytes
        if limit is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                return await _refuse(send, limit)
        messages, seen = [], 0
        while True:  # read the whole body (JSON endpoints parse it whole anyway), counting
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > limit:
                return await _refuse(send, limit)
            if not message.get("more_body", False):
                break

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
