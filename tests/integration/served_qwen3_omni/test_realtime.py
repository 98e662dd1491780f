"""User story: a voice client written for OpenAI's Realtime API (the official ``openai``
package's ``client.realtime.connect()``) holds a spoken conversation with the served
Qwen3-Omni graph: it talks, the server hears the turn end and answers in speech, talking
over the answer stops it in every stage, and later turns reuse the session's KV. A seeded
reply reproduces, speech included, streamed or not."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import uuid

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets
from openai import AsyncOpenAI

from omni_serve.api.transcriptions import transcript_budget
from omni_serve.testing.realtime_client import until, user_text
from omni_serve.testing.realtime_fuzz import fuzz_session
from omni_serve.testing.served_metrics import metric, stages_idle_within
from omni_serve.testing.speech_clip import pcm16, speak
from tests.integration.served_qwen3_omni import URL

pytestmark = pytest.mark.integration
SILENCE = np.zeros(24_000, np.float32)
TEXT_TURNS = {
    "type": "realtime",
    "output_modalities": ["text"],
    "audio": {"input": {"turn_detection": None}},
}


def connect():
    client = AsyncOpenAI(base_url=f"{URL}/v1", api_key="unused")
    return client.realtime.connect(model="qwen3-omni")


async def talk(conn, samples: np.ndarray, pace: float = 1.0) -> None:
    """Streams ``samples`` in 100 ms appends, at ``pace`` times real time (1: a microphone)."""
    pcm = pcm16(samples)
    for i in range(0, len(pcm), 4800):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 4800]).decode())
        await asyncio.sleep(0.1 / pace)


async def test_a_text_turn(served):
    async with connect() as conn:
        session = (await until(conn, "session.created"))[-1].session
        assert session.model == "qwen3-omni" and session.audio.output.voice == "ethan"
        await conn.session.update(session={**TEXT_TURNS, "max_output_tokens": 8})
        await until(conn, "session.updated")
        await conn.conversation.item.create(item=user_text("Say hello."))
        await conn.response.create()
        events = await until(conn, "response.done")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens"
    assert text and done.output[0].content[0].text == text
    assert done.usage.output_tokens == 8 and done.usage.input_tokens > 5


async def test_a_spoken_turn_is_heard_ending_and_answered_in_speech(served):
    """server_vad (the default): the clip's end, the silence window, then the answer."""
    async with connect() as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 6})
        await talk(
            conn, np.concatenate([SILENCE, speak("What is the weather like today?"), SILENCE])
        )
        events = await until(conn, "response.done")
    kinds = [e.type for e in events]
    assert (
        kinds.index("input_audio_buffer.speech_started")
        < kinds.index("input_audio_buffer.speech_stopped")
        < kinds.index("input_audio_buffer.committed")
    )
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    transcript = "".join(
        e.delta for e in events if e.type == "response.output_audio_transcript.delta"
    )
    done = events[-1].response
    assert done.status in ("completed", "incomplete") and len(audio) > 24_000  # > 0.5 s
    assert done.output[0].content[0].transcript == transcript
    assert done.usage.input_tokens > 20  # the clip was heard: audio tokens in the prompt


async def test_a_turn_is_transcribed_as_the_transcriptions_route_transcribes_its_clip(served):
    """A voice client that asks for input transcription gets the user's committed turn in
    words, the words /v1/audio/transcriptions gives for the same clip."""
    clip = speak("What is the weather like today?")
    async with connect() as conn:
        await until(conn, "session.created")
        transcription = {"model": "qwen3-omni", "language": "en"}
        session = {**TEXT_TURNS}
        session["audio"] = {"input": {"turn_detection": None, "transcription": transcription}}
        await conn.session.update(session=session)
        await until(conn, "session.updated")
        await talk(conn, clip, pace=10)
        await conn.input_audio_buffer.commit()
        events = await until(conn, "conversation.item.input_audio_transcription.completed")
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    done = events[-1]
    deltas = [e.delta for e in events if e.type.endswith("input_audio_transcription.delta")]
    assert done.item_id == committed.item_id and done.transcript == "".join(deltas)
    assert done.usage.input_tokens > 10 and done.usage.output_tokens >= len(deltas) > 0
    # the transcript's budget follows the clip's length, as the route's does
    assert done.usage.output_tokens <= transcript_budget(len(clip) / 24_000, 10**6)
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm16(clip), "<i2"), 24_000, format="WAV", subtype="PCM_16")
    client = AsyncOpenAI(base_url=f"{URL}/v1", api_key="unused")
    route = await client.audio.transcriptions.create(
        model="qwen3-omni", file=("clip.wav", wav.getvalue()), language="en"
    )
    assert done.transcript == route.text


async def test_talking_over_an_answer_stops_it_in_every_stage(served):
    async with connect() as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 200})
        await conn.conversation.item.create(item=user_text("Tell me a long story."))
        await conn.response.create()
        await until(conn, "response.output_audio.delta")
        await talk(conn, speak("Wait, stop."))
        events = await until(conn, "response.done")
        kinds = [e.type for e in events]
        assert "input_audio_buffer.speech_started" in kinds
        done = events[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
        assert stages_idle_within(URL)  # counted in flight until it stopped, then:
        metrics = httpx.get(f"{URL}/metrics", timeout=30).text
        assert metric(metrics, 'omni_requests_total{status="cancelled"}') >= 1
        await talk(conn, SILENCE)  # the interrupting turn ends and is answered
        assert (await until(conn, "response.done"))[-1].response.status in (
            "completed",
            "incomplete",
        )


async def test_a_conversation_keeps_its_items_and_the_thinkers_kv_across_turns(served):
    # > one 128-token KV block; unique, so no earlier story's prompt on this shared server
    # (test_chat's system prompt is the same sentence) is in the prefix cache already
    instructions = f"Session {uuid.uuid4().hex}. " + "You answer briefly and kindly. " * 40
    async with connect() as conn:
        await conn.session.update(
            session={**TEXT_TURNS, "instructions": instructions, "max_output_tokens": 4}
        )
        usage = []
        for text in ("Name a colour.", "And another?"):
            await conn.conversation.item.create(item=user_text(text))
            await conn.response.create()
            usage.append((await until(conn, "response.done"))[-1].response.usage)
    assert usage[1].input_tokens > usage[0].input_tokens + 4  # turn one's answer is in it
    assert usage[0].input_token_details.cached_tokens == 0
    assert usage[1].input_token_details.cached_tokens >= 128


async def test_a_conversation_longer_than_the_thinkers_context_goes_on(served):
    """A long conversation outgrows the Thinker's context (4,096 tokens on the tiny model):
    its oldest items leave the model's context, not the conversation, and it answers."""
    async with connect() as conn:
        await conn.session.update(session={**TEXT_TURNS, "max_output_tokens": 8})
        for i, words in enumerate((2000, 600)):  # 5 tokens a word here: 13,000 tokens
            item = {**user_text("hello " * words), "id": f"long{i}"}
            await conn.conversation.item.create(item=item)
        await conn.response.create()
        done = (await until(conn, "response.done"))[-1].response
        await conn.conversation.item.retrieve(item_id="long0")
        kept = (await until(conn, "conversation.item.retrieved"))[-1].item
    assert done.status == "incomplete", done.status_details
    assert done.usage.output_tokens == 8
    assert 2900 < done.usage.input_tokens <= 4096 - 8  # the newest item, not the oldest
    assert kept.content[0].text.count("hello") == 2000


async def test_bad_events_get_errors_and_the_session_stays_usable(served):
    async with connect() as conn:
        await until(conn, "session.created")
        for event in (
            {"type": "session.update", "session": {"tools": [{"type": "function"}]}},
            {"type": "input_audio_buffer.commit"},
            {"type": "what.is.this"},
        ):
            await conn.send(event)
            assert (await until(conn, "error"))[-1].error.type == "invalid_request_error"
        await conn.session.update(session={**TEXT_TURNS, "max_output_tokens": 3})
        await conn.conversation.item.create(item=user_text("Hi"))
        await conn.response.create()
        assert (await until(conn, "response.done"))[-1].response.usage.output_tokens == 3


@pytest.mark.parametrize("seed", [1, 2])
async def test_fuzzed_events_get_no_server_fault_and_the_stages_answer_after(served, seed):
    """A buggy client's hundreds of odd events (mutated fields, frames that are not events)
    are each refused or done, none a server fault, and the real stages answer its next turn."""
    report = await fuzz_session("ws://127.0.0.1:8000/v1/realtime?model=qwen3-omni", 500, seed)
    assert report.problems() == []
    assert report.seen["response.done"] > 2 and report.seen["error"] > 100


async def test_a_silent_user_is_prompted_after_the_idle_timeout(served):
    """Server VAD's idle_timeout_ms: a user who says nothing for that long after an answer
    gets input_audio_buffer.timeout_triggered, their silence committed as a turn, and an
    answer to it from the real stages."""
    vad = {"type": "server_vad", "idle_timeout_ms": 1000}
    async with connect() as conn:
        await conn.session.update(
            session={
                **TEXT_TURNS,
                "max_output_tokens": 3,
                "audio": {"input": {"turn_detection": vad}},
            }
        )
        await until(conn, "session.updated")
        await conn.conversation.item.create(item=user_text("Hi"))
        await conn.response.create()
        await until(conn, "response.done")
        answered = asyncio.get_running_loop().time()
        events = await until(conn, "response.done", timeout=60)
        waited = asyncio.get_running_loop().time() - answered
    kinds = [e.type for e in events]
    assert kinds[:2] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed"]
    assert waited >= 1.0
    added = next(e.item for e in events if e.type == "conversation.item.added")
    assert added.role == "user" and added.content[0].type == "input_audio"
    assert events[-1].response.status == "incomplete"  # its 3 tokens, from the stages
    assert events[-1].response.usage.output_tokens == 3


async def test_another_model_is_refused_with_a_reason(served):
    async with websockets.connect("ws://127.0.0.1:8000/v1/realtime?model=gpt-realtime") as ws:
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "model_not_found"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd.code == 1008


def _spoken(body: dict) -> np.ndarray:
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    wav = base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])
    return sf.read(io.BytesIO(wav), dtype="int16")[0]


def test_a_seed_reproduces_the_spoken_reply_and_streaming_changes_no_sample(served):
    """The Talker samples (temperature 0.9 by default): the request's seed fixes its draws."""
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 8,
        "temperature": 0,
        "seed": 1234,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "stage_overrides": {"talker": {"max_tokens": 40}},
    }
    first, second = _spoken(body), _spoken(body)
    assert len(first) > 0 and np.array_equal(first, second)
    assert not np.array_equal(first, _spoken({**body, "seed": 4321}))
    streamed = b""
    with httpx.stream(
        "POST",
        f"{URL}/v1/chat/completions",
        timeout=300,
        json={**body, "stream": True, "audio": {**body["audio"], "format": "pcm16"}},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {})
                if "audio" in delta:
                    streamed += base64.b64decode(delta["audio"]["data"])
    assert np.array_equal(np.frombuffer(streamed, "<i2"), first)


async def test_livekit_agents_openai_realtime_plugin_gets_a_spoken_answer(served):
    """User story: a LiveKit voice agent built on its OpenAI Realtime plugin, pointed at this
    server, gets an answer in text and 24 kHz speech. The plugin's defaults ask for what this
    model does not offer (semantic VAD, a transcription model), so the agent says no to them."""
    from livekit.plugins.openai import realtime
    from openai.types.realtime.realtime_audio_input_turn_detection import ServerVad

    model = realtime.RealtimeModel(
        model="qwen3-omni",
        voice="ethan",
        base_url=f"{URL}/v1",
        api_key="unused",
        input_audio_transcription=None,
        input_audio_noise_reduction=None,
        turn_detection=ServerVad(type="server_vad"),
    )
    model.update_options(max_response_output_tokens=8)
    session = model.session()
    errors = []
    session.on("error", errors.append)
    try:
        context = session.chat_ctx.copy()
        context.add_message(role="user", content="Say hello.")
        await session.update_chat_ctx(context)
        generation = await asyncio.wait_for(session.generate_reply(), 60)
        message = await asyncio.wait_for(anext(aiter(generation.message_stream)), 60)

        async def text() -> str:
            return "".join([piece async for piece in message.text_stream])

        async def frames() -> list:
            return [frame async for frame in message.audio_stream]

        said, heard = await asyncio.wait_for(asyncio.gather(text(), frames()), 120)
    finally:
        await session.aclose()
        await model.aclose()
    assert not errors, errors
    assert said and heard and {f.sample_rate for f in heard} == {24_000}
    assert sum(f.samples_per_channel for f in heard) > 24_000 // 2
