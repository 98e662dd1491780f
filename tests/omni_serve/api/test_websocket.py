"""The audio WebSocket's connection: an idle client is told why and disconnected (it cannot
hold an ingress slot forever); a voice sent as binary frames goes to the chat that asks for it
as it stood then; the client can cancel an answer mid-stream, and requests sent meanwhile
wait their turn; an audio event and its frame are never split by a cancel."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import numpy as np
import pytest
import soundfile as sf
from fastapi import FastAPI, WebSocket
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omni_serve.api.errors import ApiError
from omni_serve.api.websocket import (
    IDLE_CLOSE_CODE,
    MAX_WAITING_REQUESTS,
    IdleTimeout,
    VoiceSocket,
    clip_message,
)


def echo_app(
    idle_timeout_s: float = 0.3, max_audio_bytes: int = 64, max_audio_seconds: float = 60
) -> TestClient:
    """Echoes each request and the bytes of the clip it took; ``{"type": "long", "ticks": n}``
    streams n ticks 20 ms apart, or until cancelled (recorded in ``app.state.cancelled``)."""
    app = FastAPI()
    app.state.cancelled = []

    async def ticking(socket: VoiceSocket, response_id: str, ticks: int) -> None:
        try:
            for _ in range(ticks):
                await socket.send({"type": "tick", "id": response_id})
                await asyncio.sleep(0.02)
            await socket.send({"type": "response.done", "id": response_id})
        except asyncio.CancelledError:
            app.state.cancelled.append(response_id)
            raise

    @app.websocket("/ws")
    async def session(ws: WebSocket):
        await ws.accept()
        socket = VoiceSocket(ws, idle_timeout_s, max_audio_bytes, max_audio_seconds)
        try:
            n = 0
            while True:
                message, said = await socket.next_request()
                n += 1
                if message.get("type") == "long":
                    ticks = message.get("ticks", 10**6)
                    await socket.answer(f"r{n}", ticking(socket, f"r{n}", ticks))
                    continue
                await socket.send({"echo": message, "clip": clip_bytes(said)})
        except (IdleTimeout, WebSocketDisconnect):
            return
        finally:
            await socket.close()

    return TestClient(app)


def clip_bytes(said: dict | None) -> int | None:
    """How many bytes of PCM16 the user message a chat's clip became holds."""
    if said is None:
        return None
    wav = base64.b64decode(said["content"][0]["input_audio"]["data"])
    return sf.read(io.BytesIO(wav), dtype="int16")[0].nbytes


def test_an_idle_client_gets_a_reason_and_a_close():
    with echo_app().websocket_connect("/ws") as ws:
        event = ws.receive_json()
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == IDLE_CLOSE_CODE


def test_a_client_that_keeps_asking_or_speaking_stays_connected():
    with echo_app().websocket_connect("/ws") as ws:
        for i in range(4):  # 4 x 0.15 s > the 0.3 s idle limit in total, never between requests
            time.sleep(0.15)
            ws.send_json({"n": i})
            assert ws.receive_json() == {"echo": {"n": i}, "clip": None}
        for _ in range(4):  # frames of a voice count as activity too
            time.sleep(0.15)
            ws.send_bytes(b"\x00\x00")
        ws.send_json({"type": "chat", "input_audio": {}})
        assert ws.receive_json()["clip"] == 8


def test_the_idle_clock_starts_after_an_answer_longer_than_the_limit():
    with echo_app(idle_timeout_s=0.3).websocket_connect("/ws") as ws:
        ws.send_json({"type": "long", "ticks": 25})  # 0.5 s of answer
        events = [ws.receive_json() for _ in range(26)]
        assert events[-1] == {"type": "response.done", "id": "r1"}
        time.sleep(0.1)
        ws.send_json({"n": 1})
        assert ws.receive_json() == {"echo": {"n": 1}, "clip": None}


def test_a_chat_takes_the_frames_sent_before_it_and_no_later_ones():
    with echo_app(idle_timeout_s=5).websocket_connect("/ws") as ws:
        ws.send_bytes(b"\x01\x00" * 3)
        ws.send_bytes(b"\x02\x00" * 2)
        ws.send_json({"type": "chat", "input_audio": {"sample_rate": 16000}})
        ws.send_bytes(b"\x03\x00")
        ws.send_json({"type": "chat"})  # no input_audio: the buffer stays
        ws.send_json({"type": "chat", "input_audio": {}})
        assert [ws.receive_json()["clip"] for _ in range(3)] == [10, None, 2]
        ws.send_bytes(b"\x04\x00")
        ws.send_json({"type": "input_audio.clear"})
        ws.send_json({"type": "chat", "input_audio": {}})
        refused = ws.receive_json()["error"]
        assert refused["param"] == "input_audio" and "no audio was sent" in refused["message"]


def test_a_chat_whose_input_audio_is_refused_takes_nothing_and_can_be_sent_again():
    """The client fixes the request; its voice, already sent, is still there for it."""
    with echo_app(idle_timeout_s=5, max_audio_seconds=0.001).websocket_connect("/ws") as ws:
        ws.send_bytes(b"\x01\x00" * 8)  # 1 ms at 8 kHz
        ws.send_json({"type": "chat", "input_audio": {"sample_rate": 100}})
        assert ws.receive_json()["error"]["param"] == "input_audio.sample_rate"
        ws.send_bytes(b"\x02\x00" * 8)  # 2 ms in all: over max_audio_seconds
        ws.send_json({"type": "chat", "input_audio": {"sample_rate": 8000}})
        assert "over max_audio_seconds" in ws.receive_json()["error"]["message"]
        ws.send_json({"type": "chat", "input_audio": {"sample_rate": 16000}})  # 1 ms at 16 kHz
        assert ws.receive_json()["clip"] == 32


def test_frames_and_messages_it_cannot_take_are_errors_and_the_socket_stays():
    with echo_app(idle_timeout_s=5, max_audio_bytes=8).websocket_connect("/ws") as ws:
        ws.send_bytes(b"\x00" * 3)
        assert "even number of bytes" in ws.receive_json()["error"]["message"]
        ws.send_bytes(b"\x00" * 6)
        ws.send_bytes(b"\x00" * 4)
        assert (
            "max_audio_bytes (8); this frame was dropped" in ws.receive_json()["error"]["message"]
        )
        ws.send_text("{not json")
        assert ws.receive_json()["error"]["message"].startswith("not JSON")
        ws.send_json({"type": "response.cancel"})
        assert ws.receive_json()["error"]["message"] == "response.cancel: no response is running"
        ws.send_json({"type": "chat", "input_audio": {}})
        assert ws.receive_json()["clip"] == 6


def test_a_cancel_stops_the_answer_and_requests_sent_meanwhile_run_after_it():
    client = echo_app(idle_timeout_s=5)
    with client.websocket_connect("/ws") as ws:
        ws.send_json({"type": "long"})
        assert ws.receive_json() == {"type": "tick", "id": "r1"}
        ws.send_json({"n": 2})  # waits behind the answer
        for n in range(MAX_WAITING_REQUESTS + 1):
            ws.send_json({"n": 100 + n})
        ws.send_json({"type": "response.cancel"})
        events = [ws.receive_json()]
        while events[-1].get("type") != "response.done":
            events.append(ws.receive_json())
        assert events[-1] == {"type": "response.done", "id": "r1", "status": "cancelled"}
        refused = [e for e in events if e.get("type") == "error"]
        assert len(refused) == 2  # {"n": 2} and 7 more wait; the 9th and 10th are refused
        assert "at most 8 requests may wait" in refused[0]["error"]["message"]
        assert client.app.state.cancelled == ["r1"]
        assert ws.receive_json() == {"echo": {"n": 2}, "clip": None}
        waited = [ws.receive_json()["echo"]["n"] for _ in range(MAX_WAITING_REQUESTS - 1)]
        assert waited == list(range(100, 100 + MAX_WAITING_REQUESTS - 1))


class SlowSocket:
    """A WebSocket whose binary sends take a while, recording what was sent."""

    def __init__(self) -> None:
        self.sent: list = []
        self.incoming: asyncio.Queue = asyncio.Queue()

    async def send_json(self, event):
        self.sent.append(event)

    async def send_bytes(self, frame):
        await asyncio.sleep(0.05)
        self.sent.append(frame)

    async def receive(self):
        return await self.incoming.get()


async def test_a_cancel_between_an_audio_event_and_its_frame_waits_for_the_frame():
    ws = SlowSocket()
    socket = VoiceSocket(ws, idle_timeout_s=None, max_audio_bytes=64)

    async def speaking():
        await socket.send({"type": "response.audio.delta", "bytes": 2}, b"\x00\x00")
        await asyncio.sleep(10)

    answering = asyncio.create_task(socket.answer("r1", speaking()))
    await asyncio.sleep(0.01)  # the event is out, its frame on its way
    await ws.incoming.put({"type": "websocket.receive", "text": '{"type": "response.cancel"}'})
    await asyncio.wait_for(answering, 5)
    assert ws.sent == [
        {"type": "response.audio.delta", "bytes": 2},
        b"\x00\x00",
        {"type": "response.done", "id": "r1", "status": "cancelled"},
    ]
    await ws.incoming.put({"type": "websocket.disconnect"})
    with pytest.raises(WebSocketDisconnect):
        await socket.next_request()
    await socket.close()


def test_a_clip_becomes_a_user_message_with_its_samples():
    samples = (np.sin(np.arange(2400) / 7) * 20000).astype("<i2")
    message = clip_message({"sample_rate": 24000}, samples.tobytes(), max_seconds=60)
    assert message["role"] == "user"
    part = message["content"][0]["input_audio"]
    decoded, rate = sf.read(io.BytesIO(base64.b64decode(part["data"])), dtype="int16")
    assert rate == 24000 and np.array_equal(decoded, samples)
    with pytest.raises(ApiError, match="no audio was sent since the last clip"):
        clip_message({}, b"", max_seconds=60)
    with pytest.raises(ApiError, match=r"2.0 s of audio is over max_audio_seconds \(1\)"):
        clip_message(None, b"\x00\x00" * 32000, max_seconds=1)
    for bad, where in (
        ({"sample_rate": 100}, "input_audio.sample_rate"),
        ([], "input_audio"),
        ({"rate": 1}, "input_audio.rate"),
    ):
        with pytest.raises(ApiError) as refused:
            clip_message(bad, samples.tobytes(), max_seconds=60)
        assert refused.value.param == where and refused.value.message.startswith(f"{where}: ")


async def test_a_client_that_leaves_mid_answer_stops_it():
    """Also where the server does not cancel the connection's handler when its client goes."""
    ws = SlowSocket()
    socket = VoiceSocket(ws, idle_timeout_s=None, max_audio_bytes=64)
    stopped = asyncio.Event()

    async def speaking():
        try:
            await asyncio.sleep(10)
        finally:
            stopped.set()

    answering = asyncio.create_task(socket.answer("r1", speaking()))
    await asyncio.sleep(0.01)
    await ws.incoming.put({"type": "websocket.disconnect"})
    with pytest.raises(WebSocketDisconnect):
        await asyncio.wait_for(answering, 5)
    assert stopped.is_set() and ws.sent == []  # nothing sent to a client that is gone
    await socket.close()
