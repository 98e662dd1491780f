"""Loading the Qwen-Image stages from one diffusers checkpoint directory, and the two
non-denoising stages: prompt encoding (text encoder) and latent decoding (VAE).

Each stage loads only its own components (``from_pretrained(..., <other>=None)``), so a text
encoder replica holds no DiT weights and the other way round; the code that runs them is
diffusers' own (``encode_prompt``, ``_unpack_latents``, the VAE and its image processor), so a
real Qwen-Image checkpoint directory works unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from diffusers import QwenImagePipeline
from diffusers.image_processor import VaeImageProcessor

from omni_serve.config import StepCacheSettings
from omni_serve.engines.diffusion.step_cache import StepCache
from omni_serve.models.qwen_image.denoise import VAE_SCALE_FACTOR, Denoiser

# Above this many pixels the VAE decodes in tiles (bounded memory for large images).
VAE_TILING_MIN_PIXELS = 1024 * 1024


def _load(path: str | Path, dtype: torch.dtype, keep: set[str]) -> QwenImagePipeline:
    components = {"text_encoder", "tokenizer", "transformer", "vae", "scheduler"}
    skip = {name: None for name in components - keep}
    return QwenImagePipeline.from_pretrained(str(path), torch_dtype=dtype, **skip)


class PromptEncoder:
    """Text (and negative text) to the DiT's conditioning rows."""

    def __init__(
        self, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> None:
        self.pipe = _load(path, dtype, {"text_encoder", "tokenizer"})
        self.pipe.text_encoder.to(device)
        self.device = device

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [L_i, D] host tensor per prompt (its valid rows, padding dropped)."""
        embeds, mask = self.pipe.encode_prompt(prompts, device=self.device)
        embeds = embeds.cpu()
        if mask is None:
            return list(embeds)
        return [row[: int(m.sum())] for row, m in zip(embeds, mask.cpu(), strict=True)]


def load_denoiser(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    step_cache: StepCacheSettings | None = None,
    device: str = "cpu",
) -> Denoiser:
    pipe = _load(path, dtype, {"transformer", "scheduler"})
    pipe.transformer.to(device)
    cache = None
    if step_cache is not None and step_cache.enabled:
        cache = StepCache(pipe.transformer, step_cache)
    return Denoiser(pipe.transformer, dict(pipe.scheduler.config), cache)


class LatentDecoder:
    """Packed latents to RGB uint8 images [H, W, 3]."""

    def __init__(
        self, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> None:
        self.vae = _load(path, dtype, {"vae"}).vae.eval().to(device)
        self.processor = VaeImageProcessor(vae_scale_factor=VAE_SCALE_FACTOR * 2)
        config = self.vae.config
        self.mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1)
        # The pipeline divides by 1/std (not multiplies by std): same rounding as it.
        self.inv_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1)

    @torch.no_grad()
    def decode(self, packed: torch.Tensor, height: int, width: int) -> np.ndarray:
        latents = QwenImagePipeline._unpack_latents(packed[None], height, width, VAE_SCALE_FACTOR)
        latents = latents.to(device=self.vae.device, dtype=self.vae.dtype)
        mean, inv_std = (t.to(latents.device, latents.dtype) for t in (self.mean, self.inv_std))
        latents = latents / inv_std + mean
        if height * width >= VAE_TILING_MIN_PIXELS:
            self.vae.enable_tiling()
        else:
            self.vae.disable_tiling()
        image = self.vae.decode(latents, return_dict=False)[0][:, :, 0]
        array = self.processor.postprocess(image, output_type="np")[0]
        return (array * 255).round().astype(np.uint8)
