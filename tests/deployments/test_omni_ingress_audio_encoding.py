"""A whole spoken reply is encoded off the ingress's event loop: mp3 and opus take 5-12 ms of
CPU per second of audio, and the loop writes every other client's stream meanwhile."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.api.speech import SpeechRequest
from omni_serve.models.thinker_talker.chat_flow import ChatEvent, ChatOptions, ChatResult
from tests.deployments.bare_ingress import IngressClass, bare_ingress

REPLY = ChatResult(
    text="hi",
    token_ids=[1, 2],
    finish_reason="stop",
    prompt_tokens=3,
    audio=np.zeros(2400, dtype=np.float32),
)


def _ingress() -> object:
    """An ingress whose chat path answers REPLY to anything."""
    ingress = bare_ingress()

    async def answered(*args, **kwargs):
        yield ChatEvent(kind="done", result=REPLY)

    async def speech_events(body, deadline=True):
        return answered()

    async def prepared(body):
        return None, ChatOptions({}, want_audio=True)

    ingress.chat.events, ingress.chat.speech_events = answered, speech_events
    ingress.chat.prepare = prepared
    return ingress


@pytest.mark.parametrize("route", ["chat_completions", "speech"])
async def test_a_whole_reply_is_encoded_in_a_worker_thread(monkeypatch, route):
    threads = []

    def recording(samples, sample_rate, fmt, speed=1.0):
        threads.append(threading.current_thread())
        return b"encoded"

    # the globals the route reads (Serve's decorator may hold a copy of its module's)
    monkeypatch.setitem(getattr(IngressClass, route).__globals__, "encode_audio", recording)
    ingress = _ingress()
    if route == "speech":
        body = SpeechRequest(model="qwen3-omni", input="Hi", response_format="mp3")
        response = await IngressClass.speech(ingress, body)
        assert response.body == b"encoded"
    else:
        body = ChatCompletionRequest(
            model="qwen3-omni",
            messages=[{"role": "user", "content": "Hi"}],
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "opus"},
        )
        response = await IngressClass.chat_completions(ingress, body)
        assert b'"data":"ZW5jb2RlZA=="' in response.body  # base64 of b"encoded"
    assert threads and threading.main_thread() not in threads
