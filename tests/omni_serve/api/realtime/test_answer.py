"""An answer's start cushion: on a loaded server its first audio is held back until enough is
made to play on without a gap, then sent as one delta; the text is not held, an answer
shorter than the cushion still sends all its audio, one that fails sends what was made
before its error, and one cancelled while held sends none."""

from __future__ import annotations

import base64

import pytest
from openai import AsyncOpenAI

from omni_serve.testing.realtime_client import until, user_text

CHUNK = 960 * 2  # a scripted 40 ms audio chunk as PCM16 bytes


async def ask_to_talk(conn) -> None:
    await conn.session.update(
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    )
    await conn.conversation.item.create(item=user_text("Talk"))
    await conn.response.create()


async def spoken_answer(base_url: str) -> list:
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await ask_to_talk(conn)
        return await until(conn, "response.done")


def audio_deltas(events: list) -> list[int]:
    return [
        len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta"
    ]


@pytest.mark.parametrize(
    ("cushion_s", "first_chunks"),
    [(0.0, 1), (0.1, 3), (0.12, 3), (0.13, 4)],
)
async def test_the_first_audio_waits_for_the_cushion_then_flows_as_made(
    realtime_server, cushion_s, first_chunks
):
    base_url, chat = realtime_server
    chat.words, chat.gap_s = ["a", "b", "c", "d", "e", "f"], 0.01
    chat.start_cushion_s = cushion_s
    events = await spoken_answer(base_url)
    sizes = audio_deltas(events)
    assert sizes == [first_chunks * CHUNK] + [CHUNK] * (6 - first_chunks)
    kinds = [e.type for e in events]
    first_audio = kinds.index("response.output_audio.delta")
    transcripts_before = kinds[:first_audio].count("response.output_audio_transcript.delta")
    assert transcripts_before == first_chunks  # the text went out as made
    assert events[-1].response.status == "completed"


async def test_an_answer_shorter_than_the_cushion_sends_all_its_audio_before_its_done_events(
    realtime_server,
):
    base_url, chat = realtime_server
    chat.start_cushion_s = 10.0
    events = await spoken_answer(base_url)
    assert audio_deltas(events) == [2 * CHUNK]
    kinds = [e.type for e in events]
    assert kinds.index("response.output_audio.delta") < kinds.index("response.output_audio.done")
    done = events[-1].response
    assert done.status == "completed"


async def test_audio_held_when_a_stage_fails_reaches_the_client_before_the_error(realtime_server):
    base_url, chat = realtime_server
    chat.words, chat.fail_after, chat.start_cushion_s = ["a", "b", "c", "d"], 3, 10.0
    events = await spoken_answer(base_url)
    assert audio_deltas(events) == [3 * CHUNK]
    kinds = [e.type for e in events]
    assert kinds.index("response.output_audio.delta") < kinds.index("error")
    done = events[-1].response
    assert done.status == "failed"
    assert done.output[0].content[0].transcript == "abc"


async def test_an_answer_cancelled_while_its_audio_is_held_sends_no_audio(realtime_server):
    base_url, chat = realtime_server
    chat.endless, chat.gap_s, chat.start_cushion_s = True, 0.01, 10.0
    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    async with client.realtime.connect(model="omni-test") as conn:
        await ask_to_talk(conn)
        events = []
        while [e.type for e in events].count("response.output_audio_transcript.delta") < 3:
            events += await until(conn, "response.output_audio_transcript.delta")
        await conn.response.cancel()
        events += await until(conn, "response.done")
    assert audio_deltas(events) == []
    assert events[-1].response.status == "cancelled"
    assert len(chat.closed) == 1
