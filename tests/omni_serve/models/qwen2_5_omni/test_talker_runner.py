"""Golden tests: the torch engine running the Qwen2.5-Omni Talker reproduces transformers'
Talker codes (greedy) for text, audio, image and video prompts, alone, batched and streamed."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY, TorchAREngine
from omni_serve.models.qwen2_5_omni.talker_runner import TalkerRunner
from tests.omni_serve.models.qwen2_5_omni.conftest import KINDS, collect_codes, talker_request


def new_engine(tiny_model, builder, max_batch_size: int = 4) -> TorchAREngine:
    runner = TalkerRunner(tiny_model.talker, builder.pad_row, max_batch_size, max_len=1024)
    return TorchAREngine(runner, stop_token_ids=runner.stop_token_ids)


@pytest.mark.parametrize("kind", KINDS)
async def test_talker_codes_equal_transformers(tiny_model, builder, reference_runs, kind):
    run = reference_runs[kind]
    assert len(run.generated) > 2 and len(run.codes) > 10  # a reply worth comparing
    engine = new_engine(tiny_model, builder)
    await engine.start()
    request, _ = talker_request(tiny_model, builder, run, "r")
    codes = await collect_codes(engine, request)
    await engine.shutdown()
    assert torch.equal(codes, run.codes)


async def test_concurrent_requests_batch_and_stay_exact(tiny_model, builder, reference_runs):
    engine = new_engine(tiny_model, builder, max_batch_size=len(KINDS))
    await engine.start()
    requests = [talker_request(tiny_model, builder, reference_runs[k], k)[0] for k in KINDS]
    results = await asyncio.gather(*(collect_codes(engine, r) for r in requests))
    await engine.shutdown()
    for kind, codes in zip(KINDS, results, strict=True):
        assert torch.equal(codes, reference_runs[kind].codes), kind
    assert engine.stats.max_batch == len(KINDS)
    assert engine.stats.steps < engine.stats.decode_rows  # batched: fewer steps than rows


async def test_streamed_text_rows_give_the_same_codes(tiny_model, builder, reference_runs):
    """The Talker follows a Thinker that is still generating: rows arrive one at a time."""
    run = reference_runs["text"]
    engine = new_engine(tiny_model, builder)
    await engine.start()
    request, trailing = talker_request(tiny_model, builder, run, "s", stream=True)
    stream = engine.generate(request)

    async def feed() -> None:
        for row in trailing:
            await asyncio.sleep(0.01)
            engine.feed("s", row)
        engine.feed("s", None)

    feeder = asyncio.get_running_loop().create_task(feed())
    tokens = [t async for chunk in stream for t in chunk.token_ids]
    await feeder
    await engine.shutdown()
    stops = engine.runner.stop_token_ids
    assert torch.equal(torch.tensor([t for t in tokens if t not in stops]), run.codes)


def test_codec_history_is_what_transformers_penalizes(tiny_model, builder, reference_runs):
    """transformers' repetition penalty counts the Talker's input ids (a mask id per prompt
    row, then pad and bos) as seen; the request carries exactly those."""
    run = reference_runs["text"]
    request, _ = talker_request(tiny_model, builder, run, "h")
    history = request.extra[PENALTY_HISTORY]
    cfg = tiny_model.config.talker_config
    assert history[-2:] == [cfg.tts_codec_pad_token_id, cfg.tts_codec_start_token_id]
    assert set(history[:-2]) == {cfg.tts_codec_mask_token_id}
    assert len(history) == len(request.prompt_embeds)
