"""User story: an operator serves Qwen3-Omni; fuzzed and idle clients cannot break it, and
a switched-off playground says which switch to turn."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from omni_serve.testing.abuse import fuzz_without_server_errors
from tests.integration.operations_qwen3_omni.app import MODEL, URL, ask, chat

pytestmark = pytest.mark.integration
WS_URL = "ws://127.0.0.1:8000/v1/audio/stream"


def test_fuzzed_requests_never_get_a_server_error(served):
    """Requests built from the app's OpenAPI spec (chat, speech, models, health, metrics) get
    no 5xx beyond backpressure/deadlines; the model name is fixed so most reach the stages."""
    paths = fuzz_without_server_errors(URL, body_fields=MODEL)
    assert paths >= {"/v1/chat/completions", "/v1/audio/speech"}


async def test_idle_websocket_clients_are_closed_and_do_not_lock_others_out(served):
    """Twenty clients open the audio WebSocket and send nothing (slowloris-style): a working
    client on another socket and plain HTTP requests are served meanwhile, and after the 2 s
    idle timeout each idle client gets an idle_timeout error event and a normal close."""
    import websockets

    idle = [await websockets.connect(WS_URL) for _ in range(20)]
    async with websockets.connect(WS_URL, max_size=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "speech",
                    "input": "Hello there.",
                    "stage_overrides": {"talker": {"max_tokens": 20}},
                }
            )
        )
        while not isinstance(frame := await ws.recv(), str) or json.loads(frame)["type"] not in (
            "response.done",
            "error",
        ):
            pass
        assert json.loads(frame)["type"] == "response.done", frame
    reply = await asyncio.to_thread(chat, ask("Hi", max_tokens=4))
    assert reply.status_code == 200
    for ws in idle:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 10)


def test_the_playground_switched_off_is_a_404_that_names_the_switch(served):
    for path in ("/", "/playground/playground.js", "/playground/config.json"):
        response = httpx.get(f"{URL}{path}", timeout=30)
        assert response.status_code == 404, path
        assert "api.playground" in response.json()["error"]["message"]
