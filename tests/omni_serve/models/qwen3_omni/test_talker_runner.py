"""Golden tests: the torch Talker engine reproduces transformers' Talker codes (greedy)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from tests.omni_serve.models.qwen3_omni.conftest import new_engine
from tests.reference import SPEAKER, TALKER_MAX_TOKENS, media_layout

KINDS = ("text", "audio", "image", "mixed", "video", "video_audio")


def talker_request(builder, run, request_id: str, stream: bool = False) -> tuple[ARRequest, list]:
    n = len(run.prompt_ids)
    prompt = builder.build_prompt(
        run.prompt_ids,
        run.hidden[0][:n],
        run.hidden[max(run.hidden)][:n],
        run.generated[0],
        SPEAKER,
        **media_layout(run.inputs),
    )
    last = len(run.generated) - 1
    trailing = [
        builder.trailing_row(t, None, i == last) for i, t in enumerate(run.generated) if i > 0
    ]
    extra = {"position_ids": prompt.position_ids, "rope_delta": prompt.rope_delta}
    if not stream:
        extra.update(trailing=trailing, text_done=True)
    sampling = SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05)
    request = ARRequest(request_id, prompt_embeds=prompt.embeds, sampling=sampling, extra=extra)
    return request, trailing


async def collect_codes(engine: TorchAREngine, request: ARRequest) -> torch.Tensor:
    frames = [c.outputs["codes"] async for c in engine.generate(request) if "codes" in c.outputs]
    return torch.stack(frames, dim=1)


@pytest.mark.parametrize("kind", KINDS)
async def test_talker_codes_equal_transformers(talker_parts, reference_runs, kind):
    engine = new_engine(talker_parts)
    await engine.start()
    request, _ = talker_request(talker_parts[1], reference_runs[kind], "r")
    codes = await collect_codes(engine, request)
    await engine.shutdown()
    assert torch.equal(codes, reference_runs[kind].codes)


@pytest.mark.parametrize("step", ["eager", "static"])
async def test_concurrent_requests_batch_and_stay_exact(talker_parts, reference_runs, step):
    """Requests of different prompt lengths decode in one batch, each at its own position;
    the static-shape step (sampling on the device) gives transformers' greedy codes too."""
    engine = new_engine(talker_parts, max_batch_size=len(KINDS), step=step)
    await engine.start()
    requests = [talker_request(talker_parts[1], reference_runs[k], k)[0] for k in KINDS]
    results = await asyncio.gather(*(collect_codes(engine, r) for r in requests))
    await engine.shutdown()
    for kind, codes in zip(KINDS, results, strict=True):
        assert torch.equal(codes, reference_runs[kind].codes), kind
    stats = engine.stats
    assert stats.max_batch == len(KINDS) and stats.prefills == len(KINDS)
    # each frame comes from one decode row (the prefill only predicts the first codebook)
    assert stats.decode_rows == sum(r.shape[1] for r in results)
    assert stats.steps < stats.decode_rows  # batched: fewer steps than rows
    assert stats.decode_s > 0 and stats.prefill_s > 0 and stats.emit_s > 0


async def test_streamed_text_rows_give_the_same_codes(talker_parts, reference_runs):
    """The Talker follows a Thinker that is still generating: rows arrive one at a time."""
    engine = new_engine(talker_parts)
    await engine.start()
    request, trailing = talker_request(talker_parts[1], reference_runs["text"], "s", stream=True)

    async def feed():
        for row in trailing:
            await asyncio.sleep(0.01)
            engine.feed("s", row)
        engine.feed("s", None)

    codes, _ = await asyncio.gather(collect_codes(engine, request), feed())
    await engine.shutdown()
    assert torch.equal(codes, reference_runs["text"].codes)


async def test_abort_frees_the_slot(talker_parts, reference_runs):
    engine = new_engine(talker_parts, max_batch_size=1)
    await engine.start()
    request, _ = talker_request(talker_parts[1], reference_runs["text"], "a", stream=True)
    stream = engine.generate(request)
    first = await stream.__anext__()  # prefill done; now waiting for text rows
    assert first.token_ids
    await engine.abort("a")
    await stream.aclose()
    assert engine.num_running == 0
    assert engine.runner.cache.free_slots == 1
    # The freed slot serves the next request correctly.
    request, _ = talker_request(talker_parts[1], reference_runs["text"], "b")
    assert torch.equal(await collect_codes(engine, request), reference_runs["text"].codes)
    await engine.shutdown()


def test_unknown_voice_is_a_value_error(talker_parts, reference_runs):
    run = reference_runs["text"]
    n = len(run.prompt_ids)
    with pytest.raises(ValueError, match="unknown voice"):
        talker_parts[1].build_prompt(
            run.prompt_ids, run.hidden[0][:n], run.hidden[0][:n], run.generated[0], "nobody"
        )


async def test_bfloat16_talker_runs(tiny_omni_path, reference_runs):
    """The dtype a GPU profile asks for (bf16) loads and decodes valid codec frames."""
    talker, config = load_talker(tiny_omni_path, dtype=torch.bfloat16)
    builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path))
    engine = new_engine((talker, builder))
    await engine.start()
    request, _ = talker_request(builder, reference_runs["text"], "bf16")
    codes = await collect_codes(engine, request)
    await engine.shutdown()
    assert codes.shape[0] == 16 and codes.shape[1] >= 1
    assert int(codes.min()) >= 0 and int(codes.max()) < 2048


@pytest.mark.parametrize(
    "text_setting",
    [
        {"stop": ["."]},
        {"presence_penalty": 1.0},
        {"logit_bias": {5: 10.0}},
        {"min_p": 0.1},
        {"min_tokens": 2},
        {"ignore_eos": True},
    ],
)
def test_text_only_settings_are_refused_by_the_engine_that_makes_no_text(
    talker_parts, text_setting
):
    engine = new_engine(talker_parts)
    request = ARRequest(
        "t", prompt_embeds=torch.zeros(3, 8), sampling=SamplingConfig(**text_setting)
    )
    (name,) = text_setting
    with pytest.raises(ValueError, match=f"^{name}: text-level settings"):
        engine.generate(request)
