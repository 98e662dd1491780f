"""The streamed chat chunks: what a streaming client can read off them."""

from __future__ import annotations

import json

from omni_serve.api.sse import ChunkWriter


def _data(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n")
    return json.loads(event[len("data: ") :])


def test_the_finish_chunk_carries_the_request_timings():
    writer = ChunkWriter("chatcmpl-1", "qwen3-omni", "audio-1", 24000, "pcm16")
    chunk = _data(writer.finish("stop", {"first_audio_s": 0.4, "total_s": 2.0}))
    assert chunk["choices"][0]["finish_reason"] == "stop"
    assert chunk["timings"] == {"first_audio_s": 0.4, "total_s": 2.0}
    assert "timings" not in _data(writer.finish("length"))
