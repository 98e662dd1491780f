"""The ingress decodes a request's videos in a worker thread, not on the event loop its other
requests' streams run on, and a bad video is a 400 naming the part."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from deployments.ingress import Ingress
from omni_serve.api.errors import ApiError
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.config import ApiSettings

IngressClass = next(k for k in Ingress.func_or_class.__mro__[1:] if k.__name__ == "Ingress")
# The namespace the class's methods see: not the module's own dict (the class behind Serve's
# deployment is a copy with its own globals), so patching the module would not reach them.
INGRESS_GLOBALS = IngressClass._decoded_videos.__globals__


def ingress(processor=None):
    found = object.__new__(IngressClass)
    found.processor = processor
    found.config = types.SimpleNamespace(api=ApiSettings())
    return found


def request(*parts: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "qwen3-omni", "messages": [{"role": "user", "content": list(parts)}]}
    )


VIDEO = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}


async def test_videos_are_decoded_off_the_event_loop(monkeypatch):
    threads = []

    def decode(processor, messages, api):
        threads.append(threading.current_thread())
        return {"messages[0].content[0]": np.zeros((2, 4, 4, 3), np.uint8)}

    monkeypatch.setitem(INGRESS_GLOBALS, "decode_videos", decode)
    frames = await ingress()._decoded_videos(request(VIDEO))
    assert list(frames) == ["messages[0].content[0]"]
    assert threads and threads[0] is not threading.main_thread()


async def test_a_request_without_video_decodes_nothing(monkeypatch):
    def decode(*_):
        raise AssertionError("nothing to decode")

    monkeypatch.setitem(INGRESS_GLOBALS, "decode_videos", decode)
    assert await ingress()._decoded_videos(request({"type": "text", "text": "hi"})) == {}


async def test_a_corrupt_video_is_a_400_naming_the_part(omni_processor):
    with pytest.raises(ApiError) as caught:
        await ingress(omni_processor)._decoded_videos(request(VIDEO))
    error = caught.value
    assert error.status == 400 and "could not decode video" in error.message
    assert error.body["error"]["param"] == "messages[0].content[0]"
