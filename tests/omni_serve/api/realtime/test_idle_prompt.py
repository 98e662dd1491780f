"""Server VAD's ``idle_timeout_ms``, through the official ``openai`` client: a user silent
after an answer's audio has played gets ``input_audio_buffer.timeout_triggered``, the buffer
committed as their turn, and another answer; speech before the timeout keeps the turn theirs.
"""

from __future__ import annotations

import numpy as np
import pytest
from openai import AsyncOpenAI

from omni_serve.testing.realtime_client import send_audio, until, user_text
from omni_serve.testing.speech_clip import speak


def session(idle_timeout_ms: int | None) -> dict:
    vad = {"type": "server_vad", "idle_timeout_ms": idle_timeout_ms}
    heard = {"turn_detection": vad, "transcription": {"model": "omni-test"}}
    return {"type": "realtime", "audio": {"input": heard}}


async def answered(conn) -> None:
    await conn.conversation.item.create(item=user_text("Hi"))
    await conn.response.create()
    await until(conn, "response.done")


async def test_silence_after_an_answer_commits_the_buffer_and_answers_again(realtime_server):
    base_url, chat = realtime_server
    client = AsyncOpenAI(base_url=base_url, api_key="-")
    async with client.realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=session(300))
        await until(conn, "session.updated")
        await answered(conn)
        events = await until(conn, "response.done", timeout=10)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed"]
    assert "response.created" in kinds and events[-1].response.status == "completed"
    assert events[0].item_id == events[1].item_id
    assert [m["role"] for m in chat.asks[1].messages] == ["user", "assistant"]
    assert chat.transcribed == []  # an empty buffer's turn has nothing to transcribe


async def test_speech_before_the_timeout_keeps_the_turn_the_users(realtime_server):
    base_url, chat = realtime_server
    client = AsyncOpenAI(base_url=base_url, api_key="-")
    silence = np.zeros(24_000, np.float32)
    said = np.concatenate([silence[:4800], speak("Wait, one more thing."), silence])
    async with client.realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=session(1500))
        await until(conn, "session.updated")
        await answered(conn)
        await send_audio(conn, said)
        events = await until(conn, "response.done", timeout=10)
    kinds = [e.type for e in events]
    assert "input_audio_buffer.timeout_triggered" not in kinds
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("response.created")


async def test_without_a_timeout_the_session_waits_for_the_user(realtime_server):
    base_url, _ = realtime_server
    client = AsyncOpenAI(base_url=base_url, api_key="-")
    async with client.realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=session(None))
        await until(conn, "session.updated")
        await answered(conn)
        with pytest.raises(TimeoutError):
            await until(conn, "input_audio_buffer.timeout_triggered", timeout=1.0)
