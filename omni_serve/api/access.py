"""Optional API key auth: ``Authorization: Bearer <key>`` on every route but ``/health``.

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``) so that WebSocket handshakes
are checked too and streamed responses pass through untouched. The key is set per ingress
replica by ``configure`` (the FastAPI app the replica serves is a copy Serve makes, so the
key cannot be set on the app object the module defines).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Mapping
from typing import Any

from omni_serve.api.playground import is_page_path
from omni_serve.api.protocol import error_body
from omni_serve.config import ApiSettings

OPEN_PATHS = frozenset({"/health"})  # load balancers and probes do not carry keys
# A browser cannot set headers on a WebSocket handshake: it offers the key as a subprotocol,
# as OpenAI's Realtime API takes it from browsers (the "insecure" says the key is in the page).
KEY_SUBPROTOCOL = "openai-insecure-api-key."


class _Key:
    value: str | None = None


def configure(api_key: str | None) -> None:
    _Key.value = api_key


def resolve_api_key(
    api: ApiSettings, proxy_host: str | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The key this ingress requires, or None; refuses to serve an open API off loopback.

    ``proxy_host`` is where Serve's HTTP proxy binds (None when unknown: treated as loopback,
    Serve's default)."""
    key = api.api_key
    if api.api_key_env is not None:
        key = environ.get(api.api_key_env) or None
        if key is None:
            raise ValueError(
                f"api.api_key_env: {api.api_key_env} is not set in the ingress replica's "
                "environment (export it before `ray start`/`serve run`, or set it in the "
                "ingress's ray_actor_options.runtime_env.env_vars)"
            )
    if key is None and proxy_host and not is_loopback(proxy_host) and not api.allow_unauthenticated:
        raise ValueError(
            f"Serve's HTTP proxy binds {proxy_host}, so the API needs a key: set api.api_key_env "
            "(or api.api_key) in the pipeline config, or api.allow_unauthenticated: true if a "
            "gateway in front authenticates"
        )
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _presented_key(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    for protocol in scope.get("subprotocols", []) if scope["type"] == "websocket" else []:
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL) :]
    return None


class ApiKeyMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = _Key.value
        if key is None or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        # The playground's files hold no data (a login page's kind): the page asks for the key.
        if scope["path"] in OPEN_PATHS or is_page_path(scope["path"]):
            return await self.app(scope, receive, send)
        presented = _presented_key(scope)
        if presented is not None and hmac.compare_digest(presented.encode(), key.encode()):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":  # refuse the handshake: policy violation
            return await send({"type": "websocket.close", "code": 1008})
        message = (
            "missing API key: send 'Authorization: Bearer <key>'"
            if presented is None
            else "invalid API key"
        )
        body = json.dumps(error_body(message, code="invalid_api_key")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
