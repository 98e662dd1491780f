"""OpenAI's Realtime protocol as the official ``openai`` client speaks it: a text turn, a
spoken turn that server VAD commits and answers by itself, barge-in, a conversation that
persists across turns, and every bad event answered with an ``error`` while the session goes
on. The answers come from a scripted chat path (conftest.py); the served model's are in
tests/integration/served_qwen3_omni/test_realtime.py."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from openai import AsyncOpenAI

from omni_serve.testing.realtime_client import send_audio, until, user_text
from omni_serve.testing.speech_clip import speak

SILENCE = np.zeros(24_000, np.float32)


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused")


TEXT_ONLY = {
    "type": "realtime",
    "output_modalities": ["text"],
    "audio": {"input": {"turn_detection": None}},
}


async def test_a_text_turn_streams_the_answer_in_openais_event_order(realtime_server):
    base_url, chat = realtime_server
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        created = await until(conn, "session.created")
        assert created[-1].session.audio.output.voice == "ethan"
        await conn.session.update(session={**TEXT_ONLY, "instructions": "Be brief."})
        updated = (await until(conn, "session.updated"))[-1]
        assert updated.session.output_modalities == ["text"]
        assert updated.session.audio.input.turn_detection is None
        await conn.conversation.item.create(item=user_text("Hi"))
        await conn.response.create()
        events = await until(conn, "response.done")
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "conversation.item.created",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    assert kinds[4:7] == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there."
    done = events[-1].response
    assert done.status == "completed" and done.output[0].content[0].text == "Hello there."
    assert done.usage.input_tokens == 7 and done.usage.output_tokens == 2
    user = {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
    assert chat.asks[0].messages == [{"role": "system", "content": "Be brief."}, user]
    assert chat.asks[0].audio is False and chat.asks[0].session_id == created[-1].session.id


async def test_server_vad_commits_a_spoken_turn_and_answers_it_in_speech(realtime_server):
    base_url, chat = realtime_server
    clip = speak("What is the capital of France?")
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await send_audio(conn, np.concatenate([SILENCE, clip, SILENCE]))
        events = await until(conn, "response.done")
    kinds = [e.type for e in events]
    for kind in (
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    ):
        assert kind in kinds, kind
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in events if e.type == "input_audio_buffer.speech_stopped")
    assert 600 <= started.audio_start_ms <= 1100  # speech begins at 1000 ms, less 300 ms padding
    speech_end_ms = 1000 + len(clip) / 24
    assert speech_end_ms < stopped.audio_end_ms < speech_end_ms + 1000
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert committed.item_id == started.item_id == stopped.item_id
    heard = chat.asks[0].messages[-1]["content"][0]
    assert heard["type"] == "input_audio" and heard["input_audio"]["format"] == "wav"
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(audio) == 2 * 960 * 2  # two 40 ms chunks of PCM16
    assert events[-1].response.output[0].content[0].transcript == "Hello there."


@pytest.mark.parametrize("early_answer_ms", [None, 100])
async def test_speech_during_an_answer_stops_it_and_keeps_only_what_was_played(
    realtime_server, early_answer_ms
):
    base_url, chat = realtime_server
    chat.early_answer_ms = early_answer_ms
    chat.endless, chat.gap_s = True, 0.01  # 40 ms chunks at 4x real time: ahead of playback
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await conn.conversation.item.create(item=user_text("Go"))
        await conn.response.create()
        await until(conn, "response.output_audio.delta")
        await asyncio.sleep(0.5)
        await send_audio(conn, speak("Stop, please."), real_time=True)
        events = await until(conn, "response.done")
        stopped_at = time.monotonic()
        kinds = [e.type for e in events]
        started = kinds.index("input_audio_buffer.speech_started")
        assert "conversation.item.truncated" in kinds[started:]
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
        timings = done.timings  # the session's own: the stages' come only with a finished chat
        assert 0 < timings["first_audio_s"] < timings["total_s"] and timings["rtf"] > 0
        assert chat.closed and chat.closed[0] <= stopped_at  # the chat's stream was closed
        truncated = next(e for e in events if e.type == "conversation.item.truncated")
        assert 400 <= truncated.audio_end_ms <= 2000  # about what had played, not all it sent
        # the user's turn still ends, commits and gets its own answer
        chat.endless = False
        await send_audio(conn, SILENCE)
        second = await until(conn, "response.done")
        assert second[-1].response.status == "completed"
    said = chat.asks[1].messages
    assert said[1]["role"] == "assistant" and said[2]["content"][0]["type"] == "input_audio"


async def test_a_conversation_persists_across_turns(realtime_server):
    base_url, chat = realtime_server
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=TEXT_ONLY)
        for words in ("One", "Two"):
            await conn.conversation.item.create(item=user_text(words))
            await conn.response.create()
            await until(conn, "response.done")
    assert [m["role"] for m in chat.asks[1].messages] == ["user", "assistant", "user"]
    assert chat.asks[1].messages[1]["content"] == "Hello there."
    assert chat.asks[0].session_id == chat.asks[1].session_id  # one Thinker replica, its KV


BAD_EVENTS = [
    ({"type": "no.such.event"}, "type", "unknown_event"),
    ({"type": "response.create"}, None, None),  # nothing to answer: no items, no instructions
    ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "audio", None),
    ({"type": "input_audio_buffer.append", "audio": "AA=="}, "audio", None),  # half a sample
    ({"type": "input_audio_buffer.commit"}, None, "input_audio_buffer_commit_empty"),
    ({"type": "response.cancel"}, "response_id", "response_cancel_not_active"),
    (
        {"type": "session.update", "session": {"tools": [{"type": "function", "name": "f"}]}},
        "session.tools",
        None,
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        },
        "session.audio.input.format",
        None,
    ),
    (
        {"type": "session.update", "session": {"audio": {"output": {"voice": "alloy"}}}},
        "session.audio.output.voice",
        None,
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
        },
        "session.audio.input.turn_detection.type",
        None,
    ),
    (
        {"type": "session.update", "session": {"max_output_tokens": 10_000}},
        "session.max_output_tokens",
        None,
    ),
    ({"type": "session.update", "session": {"model": "gpt-realtime"}}, "session.model", None),
    (
        {
            "type": "session.update",
            "session": {"include": ["item.input_audio_transcription.logprobs"]},
        },
        "session.include",
        None,
    ),
    (
        {"type": "response.create", "response": {"max_output_tokens": -3}},
        "response.max_output_tokens",
        None,
    ),
    (
        {"type": "response.create", "response": {"output_modalities": ["video"]}},
        "response.output_modalities[0]",
        None,
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "video"}]},
        },
        "item.content[0].type",
        None,
    ),
    ({"type": "session.update", "session": {"no_such_field": 1}}, "session.no_such_field", None),
    (
        {"type": "conversation.item.create", "item": {"type": "function_call", "name": "f"}},
        "item.type",
        None,
    ),
    (
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_audio", "audio": "AAAAAA=="}],
            },
        },
        "item.content[0].transcript",
        None,
    ),
    (
        {"type": "conversation.item.truncate", "item_id": "nope", "audio_end_ms": 10},
        "item_id",
        "item_not_found",
    ),
    ({"type": "output_audio_buffer.clear"}, "type", None),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}},
        },
        "session.audio.input.transcription.model",
        None,
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"language": "xx"}}}},
        },
        "session.audio.input.transcription.language",
        None,
    ),
    (
        {
            "type": "session.update",
            "session": {"audio": {"input": {"transcription": {"delay": "low"}}}},
        },
        "session.audio.input.transcription.delay",
        None,
    ),
]


@pytest.mark.parametrize(("event", "param", "code"), BAD_EVENTS)
async def test_a_bad_event_gets_an_error_naming_it_and_the_session_goes_on(
    realtime_server, event, param, code
):
    base_url, chat = realtime_server
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await conn.send({**event, "event_id": "evt_bad"})
        error = (await until(conn, "error"))[-1].error
        assert error.type == "invalid_request_error" and error.event_id == "evt_bad"
        assert error.param == param and (code is None or error.code == code), error
        await conn.session.update(session=TEXT_ONLY)
        await conn.response.create(response={"input": [user_text("x")]})
        assert (await until(conn, "response.done"))[-1].response.status == "completed"


async def test_a_second_response_while_one_runs_is_refused_and_a_cancel_stops_it(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.endless, chat.gap_s = True, 0.02
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=TEXT_ONLY)
        await conn.conversation.item.create(item=user_text("Go on."))
        await conn.response.create()
        await until(conn, "response.output_text.delta")
        await conn.response.create()
        assert (await until(conn, "error"))[-1].error.code == (
            "conversation_already_has_active_response"
        )
        await conn.response.cancel()
        done = (await until(conn, "response.done"))[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
    assert len(chat.closed) == 1


async def test_binary_frames_are_refused_with_a_reason(realtime_server):
    base_url, _ = realtime_server
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await conn._connection.send(b"\x00\x00")
        error = (await until(conn, "error"))[-1].error
        assert "input_audio_buffer.append" in error.message


async def test_an_early_answer_starts_in_the_pause_and_shows_only_once_the_turn_ends(
    realtime_server,
):
    """With early answers on, the chat starts ~silence_duration_ms - early_answer_ms before
    the turn ends, and the client sees the same events, in the same order, as without."""
    base_url, chat = realtime_server
    chat.early_answer_ms = 100
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await send_audio(conn, np.concatenate([SILENCE, speak("Hello."), SILENCE]), real_time=True)
        events = []
        async with asyncio.timeout(20):
            async for event in conn:
                events.append((time.monotonic(), event))
                if event.type == "response.done":
                    break
    kinds = [e.type for _, e in events]
    stopped_at = next(t for t, e in events if e.type == "input_audio_buffer.speech_stopped")
    assert chat.asked_at[0] < stopped_at - 0.25  # started ~400 ms before the turn ended
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert events[-1][1].response.status == "completed"
    committed = next(e for _, e in events if e.type == "input_audio_buffer.committed")
    assert chat.asks[0].messages[-1]["content"][0]["type"] == "input_audio"
    assert events[-1][1].response.output[0].id != committed.item_id
    assert len(chat.asks) == 1


async def test_speech_resuming_after_a_pause_discards_the_early_answer_without_a_trace(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.early_answer_ms = 100
    pause = np.zeros(24_000 * 3 // 10, np.float32)  # 300 ms: past 100, short of 500
    said = np.concatenate([SILENCE, speak("One moment"), pause, speak("please."), SILENCE])
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await until(conn, "session.created")
        await send_audio(conn, said, real_time=True)
        events = await until(conn, "response.done")
    kinds = [e.type for e in events]
    assert kinds.count("input_audio_buffer.speech_started") == 1
    assert kinds.count("response.created") == 1 and kinds.count("response.done") == 1
    assert len(chat.asks) >= 2 and len(chat.closed) >= 2  # the discarded one ran and stopped
    heard = chat.asks[-1].messages[-1]["content"][0]["input_audio"]["data"]
    assert len(heard) > len(chat.asks[0].messages[-1]["content"][0]["input_audio"]["data"])


async def test_a_conversation_longer_than_the_models_audio_items_goes_on(realtime_server):
    """The fifth spoken turn is answered (the model takes 4 audio items a prompt): the
    earliest turns are heard as their transcripts, only the last two as audio."""
    base_url, chat = realtime_server
    async with client(base_url).realtime.connect(model="omni-test") as conn:
        await conn.session.update(session=TEXT_ONLY)
        for turn in range(5):
            await send_audio(conn, np.full(4800, 0.1 * (turn + 1), np.float32))
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            done = (await until(conn, "response.done"))[-1].response
            assert done.status == "completed"
    heard = [
        [part["type"] for m in ask.messages if m["role"] == "user" for part in m["content"]]
        for ask in chat.asks
    ]
    assert heard[3] == ["input_audio"] * 4
    assert heard[4] == ["input_audio"] * 2  # no transcripts here: turns 1-3 are not heard
