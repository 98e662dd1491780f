"""cache-dit step caching as a config switch: off-by-threshold is exact, on caches steps."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from omni_serve.config import StepCacheSettings
from omni_serve.models.qwen_image.denoise import ImageJob
from omni_serve.models.qwen_image.stages import load_denoiser

STEPS = 8


@pytest.fixture(scope="module")
def jobs(tiny_image_path):
    """Two jobs, and the uncached denoiser's latents for the first alone and for both (not
    bit for bit the same: on some CPUs (AVX-512 with AMX) MKL's matmuls round a row
    differently beside others)."""
    plain = load_denoiser(tiny_image_path)
    dim = plain.transformer.config.joint_attention_dim
    rows = torch.randn(7, dim, generator=torch.Generator().manual_seed(0))
    job = ImageJob(rows, 64, 64, STEPS, seed=4, negative_embeds=rows[:3] * 0.5)
    batch = [job, ImageJob(rows[:5], 64, 64, STEPS, seed=9)]
    return batch, plain.run([job])[0], plain.run(batch)


def cached(path, **settings):
    return load_denoiser(path, step_cache=StepCacheSettings(enabled=True, **settings))


def test_a_threshold_that_caches_nothing_gives_identical_latents(tiny_image_path, jobs):
    batch, reference, batch_reference = jobs
    denoiser = cached(
        tiny_image_path, compute_first_blocks=1, residual_diff_threshold=0.0, max_warmup_steps=0
    )
    assert torch.equal(denoiser.run(batch[:1])[0], reference)
    assert denoiser.last_cached_steps == 0
    together = denoiser.run(batch)
    assert all(torch.equal(a, b) for a, b in zip(together, batch_reference, strict=True))
    assert torch.equal(denoiser.run(batch[:1])[0], reference)  # a fresh context each run


def test_a_static_mask_caches_its_steps_and_stays_close(tiny_image_path, jobs):
    batch, reference, _ = jobs
    mask = [1, 1, 0, 1, 0, 1, 0, 1]
    denoiser = cached(tiny_image_path, compute_first_blocks=1, steps_mask=mask)
    first = denoiser.run(batch[:1])[0]
    assert denoiser.last_cached_steps == 3
    caching = (first - reference).abs().max()
    assert 0 < caching < reference.abs().max()
    # Static: the batch caches the same steps, so its first image is the one from alone but
    # for rounding, far below what caching a step changes.
    assert (denoiser.run(batch)[0] - first).abs().max() < caching / 1000
    assert denoiser.last_cached_steps == 3
    assert torch.equal(denoiser.run(batch[:1])[0], first)  # a fresh context each run
    with pytest.raises(ValueError, match="covers 8 steps, not 4"):
        denoiser.run([ImageJob(batch[1].prompt_embeds, 64, 64, 4, seed=1)])


def test_unconditional_caching_and_taylorseer_cache_steps(tiny_image_path, jobs):
    batch, _, _ = jobs
    denoiser = cached(
        tiny_image_path,
        compute_first_blocks=1,
        residual_diff_threshold=1e9,
        max_warmup_steps=1,
        max_continuous_cached_steps=1,
        taylorseer=True,
    )
    denoiser.run(batch)
    assert denoiser.last_cached_steps >= 3


def test_bad_settings_are_refused(tiny_image_path):
    with pytest.raises(ValidationError, match="not both"):
        StepCacheSettings(steps_mask=[1, 0], steps_mask_policy="fast")
    with pytest.raises(ValidationError):
        StepCacheSettings(thresold=0.1)
    with pytest.raises(ValueError, match="transformer's 2 blocks"):
        cached(tiny_image_path)  # the default 8 first blocks on a 2-block DiT
