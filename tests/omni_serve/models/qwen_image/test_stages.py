"""The staged Qwen-Image path (encoder -> batched denoiser -> VAE) equals diffusers' one-pass
pipeline for the same seed, with and without CFG, also when requests share a batch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from omni_serve.engines.diffusion.step_batching import StepBatcher
from omni_serve.models.qwen_image.denoise import ImageJob, pad_rows
from omni_serve.models.qwen_image.stages import LatentDecoder, PromptEncoder, load_denoiser

PROMPT = "a red fox in the snow"


@pytest.fixture(scope="module")
def stages(tiny_image_path):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(tiny_image_path)
    pipe.set_progress_bar_config(disable=True)
    return (
        pipe,
        PromptEncoder(tiny_image_path),
        load_denoiser(tiny_image_path),
        LatentDecoder(tiny_image_path),
    )


def one_pass(pipe, negative: str | None, seed: int, height: int = 128, width: int = 96):
    image = pipe(
        PROMPT,
        negative_prompt=negative,
        true_cfg_scale=4.0,
        height=height,
        width=width,
        num_inference_steps=6,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    ).images[0]
    return (image * 255).round().astype(np.uint8)


@pytest.mark.parametrize("negative", [None, "blurry, low quality"])
def test_staged_equals_one_pass_also_in_a_batch(stages, negative):
    pipe, encoder, denoiser, decoder = stages
    rows = encoder.encode([PROMPT] + ([negative] if negative else []))
    job = ImageJob(rows[0], 128, 96, 6, seed=3, negative_embeds=rows[1] if negative else None)
    # A neighbour with a different prompt length, CFG and seed shares the batch.
    short, long_negative = encoder.encode(["x", "a much longer negative prompt than the other"])
    neighbour = ImageJob(short, 128, 96, 6, seed=5, negative_embeds=long_negative)
    alone = decoder.decode(denoiser.run([job])[0], 128, 96)
    batched = denoiser.run([neighbour, job])
    reference = one_pass(pipe, negative, seed=3)
    assert alone.shape == reference.shape == (128, 96, 3)
    assert np.abs(alone.astype(int) - reference).max() <= 1
    assert np.abs(decoder.decode(batched[1], 128, 96).astype(int) - reference).max() <= 1
    assert np.abs(decoder.decode(batched[0], 128, 96).astype(int) - reference).max() > 10


def test_a_job_that_joins_a_running_batch_still_equals_one_pass(stages):
    """Step-level batching: the job starts at the neighbour's third step (so every transformer
    call mixes two timesteps, and their step counts differ); both images stay diffusers'."""
    pipe, encoder, denoiser, decoder = stages
    prompt, negative, other = encoder.encode([PROMPT, "blurry", "a much longer other prompt"])
    batcher = StepBatcher(denoiser, max_batch_size=4, result=lambda s: s.latents)
    try:
        neighbour = batcher.submit(ImageJob(other, 128, 96, 9, seed=5))
        deadline = time.monotonic() + 60
        while batcher.stats.steps < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        late = batcher.submit(ImageJob(prompt, 128, 96, 6, seed=3, negative_embeds=negative))
        latents, neighbour_latents = late.result(timeout=120), neighbour.result(timeout=120)
    finally:
        batcher.close()
    assert batcher.stats.joined_running == 1 and batcher.stats.max_batch == 2
    reference = one_pass(pipe, "blurry", seed=3)
    assert np.abs(decoder.decode(latents, 128, 96).astype(int) - reference).max() <= 1
    alone = denoiser.run([ImageJob(other, 128, 96, 9, seed=5)])[0]
    assert torch.allclose(neighbour_latents, alone, atol=1e-4)


def test_cfg_changes_the_image_and_seed_matters(stages):
    _, encoder, denoiser, decoder = stages
    prompt, negative = encoder.encode([PROMPT, "blurry"])
    plain = denoiser.run([ImageJob(prompt, 64, 64, 4, seed=1)])[0]
    guided = denoiser.run([ImageJob(prompt, 64, 64, 4, seed=1, negative_embeds=negative)])[0]
    reseeded = denoiser.run([ImageJob(prompt, 64, 64, 4, seed=2)])[0]
    assert not torch.allclose(plain, guided) and not torch.allclose(plain, reseeded)


def test_batch_rejects_mixed_shapes(stages):
    _, encoder, denoiser, _ = stages
    (prompt,) = encoder.encode([PROMPT])
    with pytest.raises(ValueError, match="share"):
        denoiser.run([ImageJob(prompt, 64, 64, 4, 0), ImageJob(prompt, 64, 128, 4, 0)])


def test_pad_rows_masks_only_when_lengths_differ():
    a, b = torch.ones(2, 4), torch.ones(3, 4)
    embeds, mask = pad_rows([a, b])
    assert embeds.shape == (2, 3, 4) and mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert embeds[0, 2].abs().sum() == 0
    assert pad_rows([a, a])[1] is None


def test_large_images_decode_in_tiles_close_to_one_pass(stages, monkeypatch):
    """From VAE_TILING_MIN_PIXELS up the VAE decodes in overlapping tiles (bounded memory);
    the blended tiles stay close to the one-piece decode."""
    from omni_serve.models.qwen_image import stages as stage_module

    *_, decoder = stages
    latents = torch.randn(32 * 32, 64, generator=torch.Generator().manual_seed(0))  # 512x512
    whole = decoder.decode(latents, 512, 512).astype(int)
    calls = []
    tiled_decode = decoder.vae.tiled_decode
    monkeypatch.setattr(
        decoder.vae, "tiled_decode", lambda *a, **k: calls.append(1) or tiled_decode(*a, **k)
    )
    monkeypatch.setattr(stage_module, "VAE_TILING_MIN_PIXELS", 512 * 512)
    tiled = decoder.decode(latents, 512, 512).astype(int)
    assert calls  # the tiled path ran
    assert tiled.shape == whole.shape == (512, 512, 3)
    assert np.abs(tiled - whole).mean() < 2.0


def test_denoising_stops_between_steps_once_every_job_is_cancelled(stages):
    import threading

    from omni_serve.models.qwen_image.denoise import DenoiseCancelled

    _, encoder, denoiser, _ = stages
    (prompt,) = encoder.encode([PROMPT])
    wanted, dropped = ImageJob(prompt, 64, 64, 3, seed=1), ImageJob(prompt, 64, 64, 3, seed=2)
    dropped.cancel.set()
    assert len(denoiser.run([wanted, dropped])) == 2  # someone still waits: the batch finishes
    long_job = ImageJob(prompt, 128, 128, 3000, seed=3)  # ~6 ms a step: ~18 s in all
    threading.Timer(0.3, long_job.cancel.set).start()
    start = time.perf_counter()
    with pytest.raises(DenoiseCancelled):
        denoiser.run([long_job])
    assert time.perf_counter() - start < 3
