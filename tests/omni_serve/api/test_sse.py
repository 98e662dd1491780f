"""The streamed chat chunks: what a streaming client can read off them."""

from __future__ import annotations

import json

from omni_serve.api.protocol import reply_usage
from omni_serve.api.sse import ChunkWriter
from omni_serve.models.thinker_talker.chat_flow import ChatEvent, ChatResult


def _data(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n")
    return json.loads(event[len("data: ") :])


def test_the_finish_chunk_carries_the_request_timings():
    writer = ChunkWriter("chatcmpl-1", "qwen3-omni", "audio-1", 24000, "pcm16")
    chunk = _data(writer.finish("stop", {"first_audio_s": 0.4, "total_s": 2.0}))
    assert chunk["choices"][0]["finish_reason"] == "stop"
    assert chunk["timings"] == {"first_audio_s": 0.4, "total_s": 2.0}
    assert "timings" not in _data(writer.finish("length"))


def test_the_done_event_gives_the_finish_chunk_then_the_usage_asked_for():
    result = ChatResult(
        text="hi", token_ids=[1, 2, 3], finish_reason="length", prompt_tokens=10, cached_tokens=4
    )
    done = ChatEvent(kind="done", result=result)
    writer = ChunkWriter("chatcmpl-1", "qwen3-omni", "audio-1", 24000, "pcm16", include_usage=True)
    finish, usage = (_data(event) for event in writer.event(done))
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"] == reply_usage(result) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    silent = ChunkWriter("chatcmpl-2", "qwen3-omni", "audio-2", 24000, "pcm16")
    assert len(silent.event(done)) == 1
