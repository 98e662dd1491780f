"""A Realtime session's memory stays bounded (``Limits.conversation_bytes``): a client that
keeps adding audio gets an ``error`` it can act on, nothing it sent is half-kept, and the
session goes on once it deletes items. What is let go, and when, is test_conversation.py's."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
from openai import AsyncOpenAI

from omni_serve.api.realtime.conversation import ITEM_BYTES
from omni_serve.testing.realtime_client import send_audio, until, user_text
from omni_serve.testing.speech_clip import speak

SECOND = 48_000  # bytes: one second of PCM16 at 24 kHz
MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def second(n: int) -> str:
    """A second of audio of its own (base64), so each turn's message differs."""
    return base64.b64encode(bytes([n]) * SECOND).decode()


def spoken_item(n: int) -> dict:
    audio = second(n)
    return {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]}


async def test_a_conversation_full_of_heard_audio_refuses_more_until_items_are_deleted(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.conversation_bytes = 6 * ITEM_BYTES + 3 * SECOND
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=MANUAL)
        await until(conn, "session.updated")
        turns = []
        for n in (1, 2):  # two spoken turns, each answered in speech
            await conn.conversation.item.create(item=spoken_item(n))
            turns.append((await until(conn, "conversation.item.created"))[-1].item.id)
            await conn.response.create()
            assert (await until(conn, "response.done"))[-1].response.status == "completed"
        # A third second of user audio: the first answer's audio goes, but the model still
        # hears both turns as audio (4 audio items a prompt), so there is no room for it.
        await conn.conversation.item.create(item=spoken_item(3), event_id="evt_third")
        error = (await until(conn, "error"))[-1].error
        assert error.code == "conversation_full" and error.event_id == "evt_third"
        assert "conversation.item.delete" in error.message
        # The buffer committed as a turn is refused too, and stays for a later commit.
        await conn.input_audio_buffer.append(audio=second(4))
        await conn.input_audio_buffer.commit()
        assert (await until(conn, "error"))[-1].error.code == "conversation_full"
        first = chat.asks[0].messages[0]
        await conn.conversation.item.delete(item_id=turns[0])
        await until(conn, "conversation.item.deleted")
        await conn.input_audio_buffer.commit()
        committed = (await until(conn, "input_audio_buffer.committed"))[-1]
        await conn.response.create()
        assert (await until(conn, "response.done"))[-1].response.status == "completed"
    heard = chat.asks[-1].messages
    assert first not in heard and len(heard) == 4  # answer 1, turn 2, answer 2, the commit
    wav = heard[-1]["content"][0]["input_audio"]["data"]
    samples, _ = sf.read(io.BytesIO(base64.b64decode(wav)), dtype="int16")
    assert samples.tobytes() == bytes([4]) * SECOND and committed.item_id  # the kept buffer


@pytest.mark.parametrize("early_answer_ms", [None, 100])
async def test_a_spoken_turn_with_no_room_is_an_error_and_the_session_still_answers(
    realtime_server, early_answer_ms
):
    """Server VAD hears a turn the conversation has no room for: an ``error``, no answer left
    waiting (an early answer started on the pause is discarded), and the next turn answers."""
    base_url, chat = realtime_server
    chat.early_answer_ms = early_answer_ms
    chat.conversation_bytes = 3 * ITEM_BYTES  # room for text, not for a spoken turn
    clip = speak("What is the capital of France?")
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await send_audio(conn, np.concatenate([np.zeros(24_000), clip, np.zeros(24_000)]))
        events = await until(conn, "error")
        assert events[-1].error.code == "conversation_full"
        assert "input_audio_buffer.speech_stopped" in [e.type for e in events]
        await conn.input_audio_buffer.clear()
        await conn.session.update(session=MANUAL)
        await until(conn, "session.updated")
        await conn.conversation.item.create(item=user_text("Hi"))
        await conn.response.create()
        events = await until(conn, "response.done")
    assert "error" not in [e.type for e in events], [e for e in events if e.type == "error"]
    assert events[-1].response.status == "completed"
    assert chat.asks[-1].messages[-1]["content"] == [{"type": "text", "text": "Hi"}]
