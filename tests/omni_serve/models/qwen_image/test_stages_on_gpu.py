"""The Qwen-Image stages on a GPU (what a stage that reserves one runs) make the image they
make on the CPU, where they are golden-tested against diffusers: prompt encoder, DiT (also
step-batched) and VAE, with rows and latents arriving on the host as the channel delivers them.
Needs a CUDA GPU: skipped elsewhere (CI has none; the runs on a lent GPU are in the issue
notes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_serve.engines.diffusion.step_batching import StepBatcher
from omni_serve.models.qwen_image.denoise import ImageJob
from omni_serve.models.qwen_image.stages import LatentDecoder, PromptEncoder, load_denoiser

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_float32"),
]
PROMPT = "a red fox in the snow"


def _stages(path, device: str):
    return (
        PromptEncoder(path, device=device),
        load_denoiser(path, device=device),
        LatentDecoder(path, device=device),
    )


def test_the_staged_pipeline_on_the_gpu_makes_the_cpu_image(tiny_image_path):
    (cpu_encoder, cpu_dit, cpu_vae), (encoder, dit, vae) = (
        _stages(tiny_image_path, d) for d in ("cpu", "cuda")
    )
    want_rows = cpu_encoder.encode([PROMPT, "blurry"])
    rows = encoder.encode([PROMPT, "blurry"])
    assert {r.device.type for r in rows} == {"cpu"}  # rows leave on the host
    for mine, theirs in zip(rows, want_rows, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
    job = ImageJob(want_rows[0], 128, 96, 6, seed=3, negative_embeds=want_rows[1])
    (latents,) = dit.run([job])
    (want_latents,) = cpu_dit.run([job])
    assert latents.device.type == "cpu"
    torch.testing.assert_close(latents, want_latents, atol=1e-3, rtol=1e-3)
    image, want = vae.decode(latents, 128, 96), cpu_vae.decode(want_latents, 128, 96)
    assert image.shape == want.shape == (128, 96, 3)
    assert np.abs(image.astype(int) - want).max() <= 2


def test_step_batching_on_the_gpu_keeps_each_image(tiny_image_path):
    encoder, dit, _ = _stages(tiny_image_path, "cuda")
    prompt, other = encoder.encode([PROMPT, "a much longer other prompt"])
    jobs = [ImageJob(prompt, 64, 64, 4, seed=1), ImageJob(other, 64, 64, 4, seed=2)]
    batcher = StepBatcher(dit, max_batch_size=4, result=lambda s: s.latents.cpu())
    try:
        batched = [f.result(timeout=120) for f in [batcher.submit(j) for j in jobs]]
    finally:
        batcher.close()
    for job, latents in zip(jobs, batched, strict=True):
        torch.testing.assert_close(latents, dit.run([job])[0], atol=1e-4, rtol=1e-4)
