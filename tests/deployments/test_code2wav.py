"""The codec stage loads its family's codec from the pipeline config: Qwen3-Omni's Code2wav and
Qwen2.5-Omni's Token2Wav, behind the same plan (``codec_info``) and decoder (``run``), and
decodes off the replica's event loop. (The whole ``decode`` call, with its channel refs, needs
a Serve replica; the served tests run it.)"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from deployments.code2wav import Code2WavDeployment
from graphs.pipeline_paths import REPO
from omni_serve.config import load_pipeline_config

PIPELINES = {
    "qwen3_omni": "qwen3_omni_tiny.yaml",
    "qwen2_5_omni": "qwen2_5_omni_tiny.yaml",
}


def stage(family: str):
    config = load_pipeline_config(REPO / "configs" / "pipelines" / PIPELINES[family])
    return Code2WavDeployment.func_or_class(config.model_dump(mode="json"), "code2wav")


@pytest.mark.parametrize("family", sorted(PIPELINES))
def test_a_stream_decodes_chunk_by_chunk_to_its_full_length(family):
    codec = stage(family)
    info = codec.codec_info()
    books = 16 if family == "qwen3_omni" else 1
    codes = torch.randint(0, 200, (books, 60), generator=torch.Generator().manual_seed(0))
    planner = info.planner("s", "Ethan")
    jobs = planner.push(codes)
    jobs.append(planner.finish())
    assert len(jobs) > 1
    audio = torch.cat(codec.codec.run(jobs))
    assert 0 < audio.abs().max() <= 1.0
    if family == "qwen2_5_omni":  # whole frames: 2 mel frames a code, 240 samples each
        assert len(audio) == 60 * info.samples_per_frame == 60 * 480
        one_shot = codec.codec.decode(codes, "Ethan")
        assert (audio - one_shot).abs().max() < 5e-4  # the bound test_token2wav holds


def test_token2wav_settings_come_from_the_pipeline():
    codec = stage("qwen2_5_omni")
    settings = codec.codec.settings
    assert (settings.num_steps, settings.left_blocks, settings.right_blocks) == (10, 4, 2)
    info = codec.codec_info()
    assert (info.align, info.lookahead, info.left_context) == (12, 24, 48)


async def test_a_decode_leaves_the_replicas_event_loop_free():
    """A Token2Wav window takes seconds on a CPU: meanwhile the replica must still take calls."""
    codec = stage("qwen2_5_omni")
    planner = codec.codec_info().planner("s", "Ethan")
    codes = torch.randint(0, 200, (1, 60), generator=torch.Generator().manual_seed(0))
    jobs = [*planner.push(codes), planner.finish()]
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    began = time.perf_counter()
    (audio,) = await codec.decode_together([jobs])
    took = time.perf_counter() - began
    ticker.cancel()
    assert len(audio) == len(jobs) and codec.stats()["decode_s"] > 0
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert max(gaps) < took / 2  # the loop ran all through the decode, not only after it
