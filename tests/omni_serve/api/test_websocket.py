"""An idle WebSocket client is told why and disconnected, so it cannot hold an ingress slot
forever; an active one is not."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omni_serve.api.websocket import IDLE_CLOSE_CODE, IdleTimeout, receive_request


@pytest.fixture
def client():
    app = FastAPI()

    @app.websocket("/ws")
    async def session(ws: WebSocket):
        await ws.accept()
        try:
            while True:
                message = await receive_request(ws, idle_timeout_s=0.3)
                await ws.send_json({"echo": message})
        except (IdleTimeout, WebSocketDisconnect):
            return

    return TestClient(app)


def test_an_idle_client_gets_a_reason_and_a_close(client):
    with client.websocket_connect("/ws") as ws:
        event = ws.receive_json()
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == IDLE_CLOSE_CODE


def test_a_client_that_keeps_asking_stays_connected(client):
    with client.websocket_connect("/ws") as ws:
        for i in range(4):  # 4 x 0.15 s > the 0.3 s idle limit in total, never between requests
            time.sleep(0.15)
            ws.send_json({"n": i})
            assert ws.receive_json() == {"echo": {"n": i}}
