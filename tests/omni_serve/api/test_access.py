"""API key auth: every route but /health needs the key once one is configured, WebSocket
handshakes included; an open API off loopback refuses to start."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omni_serve.api import access
from omni_serve.config import ApiSettings


@pytest.fixture
def client():
    app = FastAPI()
    app.add_middleware(access.ApiKeyMiddleware)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"data": []}

    @app.websocket("/v1/audio/stream")
    async def stream(ws: WebSocket):
        await ws.accept()
        await ws.send_json({"type": "hello"})
        await ws.close()

    yield TestClient(app)
    access.configure(None)


def test_without_a_configured_key_everything_is_open(client):
    access.configure(None)
    assert client.get("/v1/models").status_code == 200


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing API key"),
        ({"Authorization": "Bearer nope"}, "invalid API key"),
        ({"Authorization": "Basic s3cret"}, "missing API key"),
    ],
)
def test_a_wrong_or_missing_key_is_a_401_with_the_reason(client, headers, reason):
    access.configure("s3cret")
    response = client.get("/v1/models", headers=headers)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["message"].startswith(reason) and error["code"] == "invalid_api_key"


def test_the_right_key_passes_and_health_needs_none(client):
    access.configure("s3cret")
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200


def test_a_websocket_without_the_key_is_refused_at_the_handshake(client):
    access.configure("s3cret")
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client.websocket_connect("/v1/audio/stream"),
    ):
        pass
    assert refused.value.code == 1008
    headers = {"Authorization": "Bearer s3cret"}
    with client.websocket_connect("/v1/audio/stream", headers=headers) as ws:
        assert ws.receive_json() == {"type": "hello"}


def test_a_browser_websocket_may_offer_the_key_as_a_subprotocol(client):
    """A browser cannot set a handshake header: it offers the key as OpenAI's Realtime API
    has browsers do; a wrong one is refused as a missing one is."""
    access.configure("s3cret")
    offered = ["realtime", f"{access.KEY_SUBPROTOCOL}s3cret"]
    with client.websocket_connect("/v1/audio/stream", subprotocols=offered) as ws:
        assert ws.receive_json() == {"type": "hello"}
    wrong = ["realtime", f"{access.KEY_SUBPROTOCOL}nope"]
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client.websocket_connect("/v1/audio/stream", subprotocols=wrong),
    ):
        pass
    assert refused.value.code == 1008


@pytest.mark.parametrize("host", [None, "127.0.0.1", "localhost", "::1"])
def test_loopback_may_serve_without_a_key(host):
    assert access.resolve_api_key(ApiSettings(), host) is None


def test_a_non_loopback_bind_needs_a_key_or_an_explicit_opt_out():
    with pytest.raises(ValueError, match="binds 0.0.0.0, so the API needs a key"):
        access.resolve_api_key(ApiSettings(), "0.0.0.0")
    assert access.resolve_api_key(ApiSettings(allow_unauthenticated=True), "0.0.0.0") is None
    assert access.resolve_api_key(ApiSettings(api_key="k"), "10.0.0.5") == "k"


def test_the_key_can_come_from_the_environment():
    api = ApiSettings(api_key_env="OMNI_KEY")
    assert access.resolve_api_key(api, "0.0.0.0", {"OMNI_KEY": "from-env"}) == "from-env"
    with pytest.raises(ValueError, match="OMNI_KEY is not set"):
        access.resolve_api_key(api, "127.0.0.1", {})
    with pytest.raises(ValueError, match="api_key or api_key_env, not both"):
        ApiSettings(api_key="a", api_key_env="B")
