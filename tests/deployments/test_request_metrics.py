"""Every way in counts in /metrics: ``/v1/audio/speech`` (whole, streamed, SSE) and the
``/v1/audio/stream`` WebSocket's answers are in ``omni_requests_in_flight`` while they run and
in ``omni_requests_total`` by outcome once they end, as chats are; a streamed chat whose
client leaves counts as cancelled."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import deployments.omni_chat as omni_chat
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.sse import ChunkWriter
from omni_serve.models.thinker_talker.chat_flow import ChatEvent, ChatResult
from tests.deployments.bare_ingress import IngressClass, bare_ingress

REPLY = ChatResult(
    text="hi", token_ids=[1], finish_reason="stop", prompt_tokens=3, audio=np.zeros(2400)
)


def _ingress(in_flight_seen: list[float], fail: bool = False) -> object:
    """An ingress whose stages speak one chunk (recording the in-flight gauge meanwhile),
    then finish, or fail when ``fail``."""

    async def speech(text: str):
        return None, [1, 2]

    ingress = bare_ingress(types.SimpleNamespace(speech=speech))

    async def stages(clients, prompt, options, request_id):
        in_flight_seen.append(sample(ingress, "omni_requests_in_flight"))
        yield ChatEvent(kind="audio", audio=np.zeros(2400, dtype=np.float32))
        if fail:
            raise RuntimeError("the talker replica died")
        yield ChatEvent(kind="done", result=REPLY)

    ingress.stages = stages
    return ingress


def sample(ingress, name: str, **labels: str) -> float:
    return ingress.metrics.registry.get_sample_value(name, labels) or 0.0


async def drain(response) -> None:
    if hasattr(response, "body_iterator"):
        async for _ in response.body_iterator:
            pass


@pytest.mark.parametrize("stream_format", [None, "audio", "sse"])
async def test_speech_is_in_flight_while_it_runs_and_counted_once_it_ends(
    monkeypatch, stream_format
):
    seen: list[float] = []
    ingress = _ingress(seen)
    monkeypatch.setattr(omni_chat, "stream_chat", ingress.stages)
    body = SpeechRequest(
        model="qwen3-omni", input="Hi", response_format="pcm", stream_format=stream_format
    )
    await drain(await IngressClass.speech(ingress, body))
    assert seen == [1.0]
    assert sample(ingress, "omni_requests_in_flight") == 0.0
    assert sample(ingress, "omni_requests_total", status="ok") == 1.0


async def test_speech_that_fails_in_a_stage_is_counted_as_an_error(monkeypatch):
    seen: list[float] = []
    ingress = _ingress(seen, fail=True)
    monkeypatch.setattr(omni_chat, "stream_chat", ingress.stages)
    body = SpeechRequest(model="qwen3-omni", input="Hi", response_format="wav")
    with pytest.raises(Exception, match="replica died|stage"):
        await IngressClass.speech(ingress, body)
    assert sample(ingress, "omni_requests_in_flight") == 0.0
    assert sample(ingress, "omni_requests_total", status="ok") == 0.0
    assert sample(ingress, "omni_requests_total", status="error") == 1.0


@pytest.mark.parametrize(
    "message",
    [
        {"type": "speech", "input": "Hi"},
        {"type": "chat", "messages": [{"role": "user", "content": "Hi"}]},
    ],
)
async def test_a_websocket_answer_is_in_flight_while_it_runs_and_counted_once_it_ends(
    monkeypatch, message
):
    seen: list[float] = []
    ingress = _ingress(seen)
    monkeypatch.setattr(omni_chat, "stream_chat", ingress.stages)
    if message["type"] == "chat":  # the prompt as the chat path builds it is not the story
        prepared = types.SimpleNamespace(content="Hi")

        async def prepare(body):
            return prepared, omni_chat.ChatOptions({}, want_audio=True)

        ingress.chat.prepare = prepare
    events = await IngressClass._ws_events(ingress, message, None)
    kinds = [event.kind async for event in events]
    assert kinds == ["audio", "done"] and seen == [1.0]
    assert sample(ingress, "omni_requests_in_flight") == 0.0
    assert sample(ingress, "omni_requests_total", status="ok") == 1.0


@pytest.mark.parametrize(
    ("leaves", "fail", "status"),
    [(False, False, "ok"), (True, False, "cancelled"), (False, True, "error")],
)
async def test_a_streamed_chat_is_counted_by_how_it_ended(monkeypatch, leaves, fail, status):
    seen: list[float] = []
    ingress = _ingress(seen, fail=fail)
    monkeypatch.setattr(omni_chat, "stream_chat", ingress.stages)
    body = types.SimpleNamespace(timeout_s=None)
    writer = ChunkWriter("chatcmpl-1", "qwen3-omni", "audio-1", 24_000, "pcm16")
    options = omni_chat.ChatOptions({}, want_audio=True)
    answer = ingress.chat.sse(body, types.SimpleNamespace(content="Hi"), options, "r1", writer)
    async with contextlib.aclosing(answer):
        async for line in answer:
            if leaves and '"audio"' in line:  # the client goes after the first audio chunk
                break
    assert seen == [1.0]
    assert sample(ingress, "omni_requests_in_flight") == 0.0
    assert sample(ingress, "omni_requests_total", status=status) == 1.0
    assert (
        sum(sample(ingress, "omni_requests_total", status=s) for s in ("ok", "cancelled", "error"))
        == 1.0
    )
