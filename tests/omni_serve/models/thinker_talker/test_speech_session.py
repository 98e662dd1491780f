"""The Talker following a still-running Thinker gives exactly transformers' codes (Qwen3-Omni's
Talker; Qwen2.5-Omni's runs the same session in tests/omni_serve/models/qwen2_5_omni)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.thinker_talker.messages import (
    TOKEN_EMBEDDINGS,
    CodecFrame,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
)
from omni_serve.models.thinker_talker.speech_session import speak
from tests.omni_serve.models.qwen3_omni.conftest import new_engine
from tests.reference import SPEAKER, TALKER_MAX_TOKENS


async def thinker_stream(run, sizes, delay=0.0, empty_final=False, rows=None):
    """Replays a reference Thinker run in chunks of the given sizes, like the Thinker stage."""
    n = len(run.prompt_ids)
    if rows is None:
        rows = {0: run.hidden[0][:n], max(run.hidden): run.hidden[max(run.hidden)][:n]}
    tokens, i, first = run.generated, 0, True
    for size in sizes:
        piece = tokens[i : i + size]
        i += size
        last = i >= len(tokens) and not empty_final
        chunk = ThinkerChunk(
            piece,
            "",
            last,
            num_prompt_tokens=n,
            prompt_token_ids=run.prompt_ids if first else None,
            prompt_rows=rows if first else None,
        )
        first = False
        await asyncio.sleep(delay)
        yield chunk
        if i >= len(tokens):
            break
    if empty_final:
        yield ThinkerChunk([], "", True, "stop", num_prompt_tokens=n)


def spoken_codes(events) -> torch.Tensor:
    """The Talker's frames among ``speak``'s events, as codes [groups, frames]."""
    frames = [e.codes for e in events if isinstance(e, CodecFrame)]
    return torch.tensor(frames).T if frames else torch.empty(0, 0, dtype=torch.long)


def speak_request(prompt_ids, **grids) -> SpeakRequest:
    thinker = ThinkerRequest("s", prompt_ids, SamplingConfig(), capture=True)
    return SpeakRequest("s", thinker, prompt_ids, SPEAKER, {}, **grids)


def listed(small):
    return None if small is None else small.tolist()


def session_request(run) -> SpeakRequest:
    mask = run.inputs.get("feature_attention_mask")
    return speak_request(
        run.prompt_ids,
        image_grid_thw=listed(run.inputs.get("image_grid_thw")),
        video_grid_thw=listed(run.inputs.get("video_grid_thw")),
        video_second_per_grid=listed(run.inputs.get("video_second_per_grid")),
        audio_seqlens=listed(mask.sum(-1) if mask is not None else None),
    )


def text_tokens_of(events) -> list[int]:
    return [t for e in events if isinstance(e, ThinkerChunk) for t in e.token_ids]


def greedy(_prompt_len):
    return SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05)


async def identity(rows):
    return rows


def kept(rows):
    raise AssertionError("rows the Talker resolved must not be dropped")


@pytest.mark.parametrize(
    ("kind", "sizes", "empty_final"),
    [
        ("text", [1] * 64, False),
        ("text", [1] * 64, True),
        ("text", [3, 5, 100], False),
        ("audio", [2] * 64, True),
        ("image", [100], False),
        ("video", [5] * 4, False),
    ],
)
async def test_codes_match_transformers(talker_parts, reference_runs, kind, sizes, empty_final):
    run = reference_runs[kind]
    chunks = thinker_stream(run, sizes, delay=0.002, empty_final=empty_final)
    events = await spoken_events(talker_parts, chunks, run)
    codes = spoken_codes(events)
    assert torch.equal(codes, run.codes)
    text_tokens = text_tokens_of(events)
    assert text_tokens == run.generated


async def spoken_events(talker_parts, chunks, run, resolve=identity, drop_rows=kept) -> list:
    """``speak``'s events for the Thinker ``chunks`` of ``run``, on an engine of its own."""
    engine = new_engine(talker_parts)
    await engine.start()
    request = session_request(run)
    stream = speak(chunks, engine, talker_parts[1], request, greedy, resolve, drop_rows)
    events = [e async for e in stream]
    await engine.shutdown()
    return events


async def codes_spoken(talker_parts, chunks, run, drop_rows=kept) -> torch.Tensor:
    return spoken_codes(await spoken_events(talker_parts, chunks, run, drop_rows=drop_rows))


async def with_doubts(chunks, in_doubt):
    """The Thinker's one-token chunks, each saying how many of the newest tokens a stop string
    may reach into (``in_doubt[i]`` after token i), as its engine's ``StopStringWatch`` does."""
    i = 0
    async for chunk in chunks:
        i += len(chunk.token_ids)
        yield dataclasses.replace(chunk, stop_tokens=in_doubt[i - 1])


@pytest.mark.parametrize(("stop_tokens", "false_start"), [(1, False), (3, False), (3, True)])
async def test_a_reply_a_stop_string_ended_is_spoken_without_the_strings_tokens(
    talker_parts, reference_runs, stop_tokens, false_start
):
    """The Talker never hears the tokens that spelled the stop string (they came one by one,
    before the Thinker knew), so it speaks as if the reply had ended before them; tokens that
    only looked like the start of one are spoken once the reply went another way."""
    run = reference_runs["text"]
    n = len(run.generated)
    in_doubt = [0] * n
    for k in range(stop_tokens):  # the string's tokens, in doubt from the first of them on
        in_doubt[n - stop_tokens + k] = k + 1
    if false_start:  # tokens 2 and 3 could have begun a stop string; token 4 settled them
        in_doubt[2:4] = [1, 2]
    stopped = with_doubts(thinker_stream(run, [1] * 64, delay=0.002), in_doubt)
    spoken = await codes_spoken(talker_parts, stopped, run)
    shorter = dataclasses.replace(run, generated=run.generated[:-stop_tokens])
    expected = await codes_spoken(talker_parts, thinker_stream(shorter, [1] * 64), shorter)
    assert torch.equal(spoken, expected)
    assert not torch.equal(spoken, run.codes)  # the tokens taken back would have been heard


async def test_a_reply_that_was_all_stop_string_is_not_spoken(talker_parts, reference_runs):
    run = reference_runs["text"]
    n = len(run.generated)
    stopped = with_doubts(thinker_stream(run, [1] * 64), list(range(1, n + 1)))
    dropped = []
    codes = await codes_spoken(talker_parts, stopped, run, drop_rows=dropped.append)
    assert codes.numel() == 0 and len(dropped) == 1  # and the prompt rows are handed back


async def unresolvable(rows):
    raise AssertionError(f"nothing to resolve for a prompt without media, got {rows!r}")


async def test_a_prompt_without_media_speaks_from_the_token_embeddings(
    talker_parts, reference_runs
):
    """The Thinker captures nothing for a text prompt; the Talker still gives transformers'
    codes, from its own embedding table."""
    run = reference_runs["text"]
    chunks = thinker_stream(run, [2] * 64, rows=TOKEN_EMBEDDINGS)
    codes = spoken_codes(await spoken_events(talker_parts, chunks, run, resolve=unresolvable))
    assert torch.equal(codes, run.codes)


async def test_talker_starts_before_the_thinker_finishes(talker_parts, reference_runs):
    run = reference_runs["text"]
    events = await spoken_events(talker_parts, thinker_stream(run, [1] * 64, delay=0.05), run)
    kinds = ["codes" if isinstance(e, CodecFrame) else "text" for e in events]
    last_text = max(i for i, k in enumerate(kinds) if k == "text")
    first_codes = kinds.index("codes")
    assert first_codes < last_text  # audio frames were made while text was still coming


async def until_the_talker_ends(chunks, engine, tokens_first: int, then_text: bool):
    """The Thinker's first ``tokens_first`` one-token chunks; then, once the Talker has ended
    (its ``max_tokens``), the rest of the reply, or only its end (an empty final chunk), so
    that the only input the finished Talker gets is the one fed when the text ends."""
    i = 0
    async for chunk in chunks:
        if i == tokens_first:
            for _ in range(200):
                if engine.num_running == 0:
                    break
                await asyncio.sleep(0.01)
            assert engine.num_running == 0, "the Talker should have ended by now"
            if not then_text:
                yield ThinkerChunk([], "", True, "stop")
                return
        i += 1
        yield chunk


@pytest.mark.parametrize("then_text", [True, False])
async def test_a_talker_that_ends_first_leaves_the_reply_to_finish(
    talker_parts, reference_runs, then_text
):
    """The Talker may end before the Thinker (its max_tokens, or its end-of-speech code). The
    reply's text still arrives whole, the frames made are transformers' first ones, and the
    request ends: no error from feeding a Talker that ended, and no hang."""
    run = reference_runs["text"]
    engine = new_engine(talker_parts)
    await engine.start()

    def two_frames(_prompt_len):
        return SamplingConfig(max_tokens=3, repetition_penalty=1.05)

    replies = until_the_talker_ends(thinker_stream(run, [1] * 64), engine, 4, then_text)
    stream = speak(
        replies,
        engine,
        talker_parts[1],
        session_request(run),
        two_frames,
        identity,
        drop_rows=kept,
    )
    events = await asyncio.wait_for(_collect(stream), timeout=30)
    await engine.shutdown()
    text_tokens = text_tokens_of(events)
    assert text_tokens == (run.generated if then_text else run.generated[:4])
    codes = spoken_codes(events)
    # max_tokens codes make max_tokens - 1 frames, as transformers' 40 make its 39
    assert torch.equal(codes, run.codes[..., :2])


async def _collect(stream):
    return [e async for e in stream]


async def test_closing_the_stream_cancels_both_sides(talker_parts, reference_runs):
    run = reference_runs["text"]
    engine = new_engine(talker_parts)
    await engine.start()
    stream = speak(
        thinker_stream(run, [1] * 64, delay=0.05),
        engine,
        talker_parts[1],
        session_request(run),
        greedy,
        identity,
        drop_rows=kept,
    )
    async for event in stream:
        if isinstance(event, CodecFrame):
            break
    await stream.aclose()
    await asyncio.sleep(0.05)
    assert engine.num_running == 0 and engine.runner.cache.free_slots == 4
    await engine.shutdown()


async def test_given_reply_speaks_exactly_those_tokens(talker_parts, reference_runs):
    """TTS: a 1-token Thinker prefill plus the reply as given == speaking that reply."""
    from omni_serve.models.thinker_talker.speech_session import given_reply

    run = reference_runs["text"]
    prefill_only = thinker_stream(run, [1])  # the Thinker's first chunk: rows + one token
    codes = await codes_spoken(talker_parts, given_reply(prefill_only, run.generated), run)
    assert torch.equal(codes, run.codes)


async def _rows_then(then: str):
    """A Thinker that sends its prompt rows (no token yet), then fails or stalls."""
    yield ThinkerChunk(
        [], "", False, num_prompt_tokens=3, prompt_token_ids=[1, 2, 3], prompt_rows="rows-ref"
    )
    if then == "fail":
        raise RuntimeError("thinker replica died")
    await asyncio.sleep(60)


@pytest.mark.parametrize("then", ["fail", "cancelled"])
async def test_rows_the_talker_never_got_are_dropped(talker_parts, then):
    engine = new_engine(talker_parts)
    await engine.start()
    dropped = []
    stream = speak(
        _rows_then(then),
        engine,
        talker_parts[1],
        speak_request([1, 2, 3]),
        greedy,
        identity,
        drop_rows=dropped.append,
    )
    first = await stream.__anext__()
    assert isinstance(first, ThinkerChunk)
    if then == "fail":
        with pytest.raises(RuntimeError, match="died"):
            await stream.__anext__()
    else:
        assert not dropped  # still waiting for the first token
        await stream.aclose()  # the client went away before it came
    await asyncio.sleep(0.01)
    assert dropped == ["rows-ref"]
    await engine.shutdown()
