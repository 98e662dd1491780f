"""A session with ``audio.input.transcription`` gets each committed turn's transcript, as
OpenAI's clients read it: deltas then ``completed`` (or ``failed``), beside the answer,
kept on the item. The transcripts come from a scripted chat path (conftest.py); the served
model's are in tests/integration/served_qwen3_omni/test_realtime.py."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from openai import AsyncOpenAI

from omni_serve.api.errors import ApiError
from omni_serve.testing.realtime_client import send_audio, until, until_each
from omni_serve.testing.speech_clip import speak

SILENCE = np.zeros(24_000, np.float32)
TRANSCRIBED = "conversation.item.input_audio_transcription"


async def _speak_a_turn(conn, clip: np.ndarray) -> None:
    await send_audio(conn, np.concatenate([SILENCE, clip, SILENCE]))


@pytest.mark.parametrize("early_answer_ms", [None, 100])
async def test_a_committed_turn_is_transcribed_beside_its_answer(realtime_server, early_answer_ms):
    base_url, chat = realtime_server
    chat.early_answer_ms = early_answer_ms
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        asked = {"model": "omni-test", "language": "en", "prompt": "Paris"}
        await conn.session.update(session={"audio": {"input": {"transcription": asked}}})
        shown = (await until(conn, "session.updated"))[-1].session.audio.input.transcription
        assert (shown.model, shown.language, shown.prompt) == ("omni-test", "en", "Paris")
        await _speak_a_turn(conn, speak("What is the capital of France?"))
        events = await until_each(conn, {"response.done", f"{TRANSCRIBED}.completed"})
        committed = next(e for e in events if e.type == "input_audio_buffer.committed")
        deltas = [e for e in events if e.type == f"{TRANSCRIBED}.delta"]
        completed = next(e for e in events if e.type == f"{TRANSCRIBED}.completed")
        assert [d.delta for d in deltas] == chat.heard_words
        assert all(d.item_id == committed.item_id and d.content_index == 0 for d in deltas)
        assert completed.item_id == committed.item_id
        assert completed.transcript == "What is it?"
        assert completed.usage.input_tokens == 11 and completed.usage.output_tokens == 3
        assert completed.usage.total_tokens == 14
        await conn.conversation.item.retrieve(item_id=committed.item_id)
        item = (await until(conn, "conversation.item.retrieved"))[-1].item
        assert item.content[0].transcript == "What is it?"
    ((clip, settings),) = chat.transcribed
    heard = chat.asks[-1].messages[-1]["content"][0]["input_audio"]["data"]
    assert heard.startswith("UklGR")  # the answer hears the audio, not the transcript
    assert len(clip) >= 2 * len(speak("What is the capital of France?"))  # the whole turn
    assert (settings.language, settings.prompt) == ("en", "Paris")


async def test_without_transcription_a_turn_is_not_transcribed(realtime_server):
    base_url, chat = realtime_server
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        created = (await until(conn, "session.created"))[-1]
        assert created.session.audio.input.transcription is None
        await _speak_a_turn(conn, speak("Hello."))
        events = await until(conn, "response.done")
    assert not any(e.type.startswith(TRANSCRIBED) for e in events)
    assert chat.transcribed == []


async def test_a_failed_transcription_says_why_and_the_answer_goes_on(realtime_server):
    base_url, chat = realtime_server
    chat.refuse_transcript = ApiError(503, "the thinker is at capacity", code="overloaded")
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"audio": {"input": {"transcription": {}}}})
        await until(conn, "session.updated")
        await _speak_a_turn(conn, speak("Hello."))
        events = await until_each(conn, {"response.done", f"{TRANSCRIBED}.failed"})
    failed = next(e for e in events if e.type == f"{TRANSCRIBED}.failed")
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert failed.item_id == committed.item_id and failed.content_index == 0
    assert failed.error.code == "overloaded" and "capacity" in failed.error.message
    done = next(e for e in events if e.type == "response.done")
    assert done.response.status == "completed"


async def test_a_client_that_leaves_mid_transcript_stops_it(realtime_server):
    base_url, chat = realtime_server
    chat.transcript_gap_s = 30.0  # the transcript would take 90 s
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        session = {"audio": {"input": {"turn_detection": None, "transcription": {}}}}
        await conn.session.update(session=session)
        await until(conn, "session.updated")
        await conn.input_audio_buffer.append(audio=base64.b64encode(bytes(9600)).decode())
        await conn.input_audio_buffer.commit()
        await until(conn, f"{TRANSCRIBED}.delta")
        left = time.monotonic()
    async with asyncio.timeout(5):
        while not chat.transcripts_closed:
            await asyncio.sleep(0.05)
    assert chat.transcripts_closed[0] - left < 5
