"""A DiT on two workers (xfuser Ulysses-2, CFG-parallel-2, gloo) denoises to the same latents
as one worker (max abs diff < 1e-4), for prompts of any length, masked batches, CFG and not,
and image sequences that do not split evenly."""

from __future__ import annotations

import pytest
import torch

from omni_serve.config import DiTParallelSettings
from omni_serve.models.qwen_image.denoise import ImageJob
from omni_serve.models.qwen_image.parallel import usp_key_mask
from omni_serve.models.qwen_image.stages import load_denoiser
from omni_serve.testing.parallel_dit import run_on_workers

TOLERANCE = 1e-4
TEXT_DIM = 64  # tiny-qwen-image's joint_attention_dim


def batches() -> list[list[ImageJob]]:
    g = torch.Generator().manual_seed(7)

    def text(rows: int) -> torch.Tensor:
        return torch.randn(rows, TEXT_DIM, generator=g)

    return [
        # one request, odd prompt length, negative prompt of another length (masked rows)
        [ImageJob(text(7), 128, 128, 3, seed=1, negative_embeds=text(4))],
        # two requests with CFG, different lengths; 48x48 is 9 image tokens (odd)
        [
            ImageJob(text(5), 48, 48, 3, seed=2, negative_embeds=text(6)),
            ImageJob(text(9), 48, 48, 3, seed=3, negative_embeds=text(3)),
        ],
        # a batch mixing CFG and no CFG, and a request without CFG alone
        [
            ImageJob(text(6), 64, 96, 2, seed=4, negative_embeds=text(2)),
            ImageJob(text(3), 64, 96, 2, seed=5),
        ],
        [ImageJob(text(8), 96, 64, 2, seed=6)],
    ]


@pytest.fixture(scope="module")
def single_worker(tiny_image_path):
    denoiser = load_denoiser(tiny_image_path)
    return [denoiser.run(batch) for batch in batches()]


@pytest.mark.parametrize(
    "settings",
    [DiTParallelSettings(ulysses_degree=2), DiTParallelSettings(cfg_degree=2)],
    ids=["ulysses2", "cfg2"],
)
def test_two_workers_match_one(tiny_image_path, single_worker, settings):
    parallel, _ = run_on_workers(tiny_image_path, settings, batches)
    for got_batch, want_batch in zip(parallel, single_worker, strict=True):
        for got, want in zip(got_batch, want_batch, strict=True):
            assert got.shape == want.shape
            diff = (got - want).abs().max().item()
            assert diff < TOLERANCE, f"max abs diff {diff}"


def test_key_mask_follows_the_all_to_all_layout():
    # 2 workers; text of 3 tokens (row 0 keeps 2) padded to 4 -> chunks of 2; image of 3
    # tokens padded to 4 -> chunks of 2. Gathered order: [t0 t1 i0 i1 | t2 t3 i2 i3].
    text_mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    mask = usp_key_mask(text_mask, image_tokens=3, local_text=2, local_image=2, workers=2)
    assert mask.shape == (2, 1, 1, 8)
    assert mask[0, 0, 0].tolist() == [True, True, True, True, False, False, True, False]
    assert mask[1, 0, 0].tolist() == [True, True, True, True, True, False, True, False]
