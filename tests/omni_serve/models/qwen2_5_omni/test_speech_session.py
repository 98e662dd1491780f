"""The shared spoken-reply session drives Qwen2.5-Omni's Talker as the Thinker streams: each
reply token's last-layer row rides the Thinker's chunks, and the codes equal transformers'."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.qwen2_5_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.thinker_talker.messages import (
    CodecFrame,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
    pack_rows,
)
from omni_serve.models.thinker_talker.speech_session import speak
from tests.omni_serve.models.qwen2_5_omni.conftest import KINDS
from tests.omni_serve.models.qwen2_5_omni.test_talker_runner import new_engine
from tests.reference_qwen2_5_omni import SPEAKER, TALKER_MAX_TOKENS


@pytest.fixture(scope="module")
def builder(tiny_model):
    embed = tiny_model.thinker.get_input_embeddings().weight.detach()
    return TalkerInputBuilder(tiny_model.talker, tiny_model.config, embed, tiny_model.speaker_map)


async def thinker_stream(run, layer: int, rows_early: int):
    """The reference run as the Thinker stage streams it, a token a chunk: token k's row
    arrives with token k+1 (``rows_early`` chunks sooner, as vLLM's capture may run ahead)."""
    n, tokens = len(run.prompt_ids), run.generated
    reply = run.last_hidden[n:]  # rows of tokens 0 .. len-2
    sent = 0
    for i, token in enumerate(tokens):
        upto = min(len(reply), max(i + rows_early, 0))
        rows = pack_rows(reply[sent:upto]) if upto > sent else None
        sent = max(sent, upto)
        yield ThinkerChunk(
            [token],
            "",
            i == len(tokens) - 1,
            num_prompt_tokens=n,
            prompt_token_ids=run.prompt_ids if i == 0 else None,
            prompt_rows={layer: run.last_hidden[:n]} if i == 0 else None,
            reply_rows=rows,
        )


def speak_request(run) -> SpeakRequest:
    hears = {"use_audio_in_video": True} if run.kind == "video_audio" else None
    thinker = ThinkerRequest(
        "s", run.prompt_ids, SamplingConfig(), capture=True, mm_processor_kwargs=hears
    )
    mask = run.inputs.get("feature_attention_mask")
    grid = run.inputs.get("image_grid_thw")
    video_grid = run.inputs.get("video_grid_thw")
    video_step = run.inputs.get("video_second_per_grid")
    return SpeakRequest(
        "s",
        thinker,
        run.prompt_ids,
        SPEAKER.lower(),
        {},
        image_grid_thw=None if grid is None else grid.tolist(),
        video_grid_thw=None if video_grid is None else video_grid.tolist(),
        video_second_per_grid=None if video_step is None else video_step.tolist(),
        audio_seqlens=None if mask is None else mask.sum(-1).tolist(),
    )


async def resolve(rows):
    return rows


def greedy(prompt_len: int) -> SamplingConfig:
    return SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows_early", [0, 1])
async def test_streamed_reply_speaks_transformers_codes(
    tiny_model, builder, reference_runs, kind, rows_early
):
    run = reference_runs[kind]
    engine = new_engine(tiny_model, builder)
    await engine.start()
    layer = tiny_model.config.thinker_config.text_config.num_hidden_layers
    chunks = thinker_stream(run, layer, rows_early)
    events = [
        e
        async for e in speak(
            chunks, engine, builder, speak_request(run), greedy, resolve, lambda _: None
        )
    ]
    await engine.shutdown()
    codes = [e.codes[0] for e in events if isinstance(e, CodecFrame)]
    stops = engine.runner.stop_token_ids
    assert torch.equal(torch.tensor([c for c in codes if c not in stops]), run.codes)
    text = [t for e in events if isinstance(e, ThinkerChunk) for t in e.token_ids]
    assert text == run.generated


async def test_an_unknown_voice_fails_the_reply(tiny_model, builder, reference_runs):
    run = reference_runs["text"]
    engine = new_engine(tiny_model, builder)
    await engine.start()
    request = speak_request(run)
    request.voice = "nobody"
    layer = tiny_model.config.thinker_config.text_config.num_hidden_layers
    stream = speak(
        thinker_stream(run, layer, 0), engine, builder, request, greedy, resolve, lambda _: None
    )
    with pytest.raises(ValueError, match="unknown voice"):
        _ = [e async for e in stream]
    await engine.shutdown()


async def test_text_to_speech_speaks_the_given_reply_from_the_thinkers_prefill(
    tiny_model, builder, reference_runs
):
    """TTS: the Thinker prefills the prompt followed by the reply (so it has every reply
    token's row) and generates one token; the Talker speaks exactly the given reply."""
    from omni_serve.models.thinker_talker.speech_session import given_reply

    run = reference_runs["text"]
    n, reply = len(run.prompt_ids), run.generated
    layer = tiny_model.config.thinker_config.text_config.num_hidden_layers
    rows = torch.cat([run.last_hidden, torch.zeros(1, run.last_hidden.shape[1])])  # P + R rows

    async def prefill():
        yield ThinkerChunk(
            [7],
            "",
            True,
            "length",
            num_prompt_tokens=n + len(reply),
            prompt_token_ids=[*run.prompt_ids, *reply],
            prompt_rows={layer: rows},
        )

    engine = new_engine(tiny_model, builder)
    await engine.start()
    chunks = given_reply(prefill(), reply, resolve)
    events = [
        e
        async for e in speak(
            chunks, engine, builder, speak_request(run), greedy, resolve, lambda _: None
        )
    ]
    await engine.shutdown()
    codes = [e.codes[0] for e in events if isinstance(e, CodecFrame)]
    assert torch.equal(torch.tensor(codes), run.codes)
    spoken = [t for e in events if isinstance(e, ThinkerChunk) for t in e.token_ids]
    assert spoken == reply


async def test_text_to_speech_refuses_a_prefill_that_is_not_the_reply(tiny_model):
    from omni_serve.models.thinker_talker.speech_session import given_reply

    async def prefill():
        yield ThinkerChunk(
            [7], "", True, prompt_token_ids=[1, 2, 3], prompt_rows={2: torch.zeros(3, 4)}
        )

    with pytest.raises(RuntimeError, match="does not end with the reply"):
        _ = [c async for c in given_reply(prefill(), [5, 6], resolve)]
