"""One text-to-image request across the stages: encode the prompt (and the negative prompt)
once, denoise all ``n`` images in one DiT call, decode each latent on the VAE stage.

Stage-agnostic: ``ImageClients`` is implemented over Serve handles by the ingress and over
in-process objects by tests.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni_serve.models.qwen_image.messages import DenoiseRequest


@dataclass
class ImageOptions:
    prompt: str
    width: int
    height: int
    steps: int
    n: int = 1
    negative_prompt: str | None = None
    true_cfg_scale: float = 4.0
    seed: int | None = None


@dataclass
class ImageResult:
    images: list[np.ndarray]  # [H, W, 3] uint8
    seeds: list[int]
    timings: dict[str, float] = field(default_factory=dict)


class ImageClients(Protocol):
    async def encode(self, prompts: list[str]) -> list[Any]:
        """One channel ref of conditioning rows per prompt."""

    async def denoise(self, request: DenoiseRequest) -> list[Any]:
        """One channel ref of packed latents per seed of the request."""

    async def decode(self, latents: Any, height: int, width: int) -> Any:
        """A channel ref of the image [H, W, 3] uint8."""

    async def fetch(self, ref: Any) -> Any:
        """The payload of a channel ref (freed after reading)."""


async def generate_images(clients: ImageClients, options: ImageOptions) -> ImageResult:
    start = time.perf_counter()
    timings: dict[str, float] = {}
    negative = options.negative_prompt if options.true_cfg_scale > 1 else None
    texts = [options.prompt] + ([negative] if negative is not None else [])
    refs = await clients.encode(texts)
    timings["text_encoder_s"] = time.perf_counter() - start
    base = options.seed if options.seed is not None else random.randrange(2**62)
    seeds = [base + i for i in range(options.n)]
    latents = await clients.denoise(
        DenoiseRequest(
            refs[0],
            refs[1] if negative is not None else None,
            options.height,
            options.width,
            options.steps,
            options.true_cfg_scale,
            seeds,
        )
    )
    timings["dit_s"] = time.perf_counter() - start
    images = await asyncio.gather(
        *(clients.decode(ref, options.height, options.width) for ref in latents)
    )
    arrays = [np.asarray((await clients.fetch(ref)).numpy()) for ref in images]
    timings["total_s"] = time.perf_counter() - start
    return ImageResult(arrays, seeds, timings)
