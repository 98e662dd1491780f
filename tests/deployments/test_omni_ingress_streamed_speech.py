"""Speech streamed as raw audio (``stream_format: audio``): the bytes have no room for an
error, so a deadline that passes before the first chunk is a 504 before anything is sent, and
one that passes mid-stream ends the audio cleanly (found by the fuzzer: a 1 s deadline broke
the body off mid-transfer, which clients read as a broken connection)."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from omni_serve.api.deadline import iterate_within
from omni_serve.api.errors import ApiError
from omni_serve.api.speech import SpeechRequest
from tests.deployments.bare_ingress import IngressClass, bare_ingress

CHUNK = np.full(480, 0.5, dtype=np.float32)


async def events(delays: list[float]):
    """An audio chunk after each delay, then the end."""
    for delay in delays:
        await asyncio.sleep(delay)
        yield types.SimpleNamespace(kind="audio", audio=CHUNK)
    yield types.SimpleNamespace(kind="done", result=None)


async def stream(delays: list[float], deadline_s: float, fmt: str = "pcm16") -> list[bytes]:
    ingress = object.__new__(IngressClass)
    within = iterate_within(events(delays), deadline_s)
    first = await ingress._until_audio(within)
    return [chunk async for chunk in ingress._speech_bytes(first, within, fmt)]


async def test_a_deadline_before_the_first_audio_is_a_504_not_a_broken_200():
    with pytest.raises(ApiError) as caught:
        await stream([0.5], deadline_s=0.05)
    assert caught.value.status == 504 and "deadline" in caught.value.message


async def test_a_deadline_mid_stream_ends_the_audio_with_what_was_spoken():
    chunks = await stream([0.0, 0.0, 0.5, 0.0], deadline_s=0.2, fmt="wav")
    assert len(chunks) == 1 + 2  # the WAV header, then the two chunks before the deadline
    assert len(chunks[1]) == len(chunks[2]) == 2 * len(CHUNK)  # 16-bit PCM


async def test_without_a_deadline_every_chunk_arrives():
    assert len(await stream([0.0, 0.01, 0.0], deadline_s=None)) == 3


async def test_an_error_meant_for_the_client_before_the_first_audio_keeps_its_status():
    async def refused():
        raise ApiError(400, "prompt too long", "input")
        yield  # an async generator

    with pytest.raises(ApiError) as caught:
        await object.__new__(IngressClass)._until_audio(refused())
    assert caught.value.status == 400 and caught.value.message == "prompt too long"


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
@pytest.mark.parametrize("response_format", ["mp3", "opus", "flac"])
async def test_a_format_that_is_not_streamed_is_a_400_not_pcm_in_its_place(
    stream_format, response_format
):
    """SSE deltas are PCM16: an mp3 asked for as SSE would have come back as PCM, unsaid."""
    body = SpeechRequest(
        model="qwen3-omni", input="Hi", response_format=response_format, stream_format=stream_format
    )
    ingress = bare_ingress(types.SimpleNamespace())
    with pytest.raises(ApiError) as caught:
        await IngressClass.speech(ingress, body)
    assert caught.value.status == 400 and caught.value.param == "response_format"
    assert "wav or pcm" in caught.value.message and repr(stream_format) in caught.value.message
