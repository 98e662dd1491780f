"""``POST /v1/images/generations``: the OpenAI request shape plus diffusion extensions, its
validation (every bad value is a 400 naming the field), and PNG encoding of the results."""

from __future__ import annotations

import base64
import io
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

SIZE_MULTIPLE = 16  # the VAE downsamples 8x and the DiT packs 2x2 latent patches
MIN_SIDE = 64


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="What to draw.", max_length=4000)
    model: str | None = Field(None, description="Served model name (optional; one is served).")
    n: int = Field(1, ge=1, le=4, description="Images to generate for the prompt.")
    size: str | None = Field(
        None, description="'WIDTHxHEIGHT', both multiples of 16; default from the pipeline."
    )
    response_format: Literal["b64_json"] = Field(
        "b64_json", description="Only base64 PNG: the server keeps no files to link to."
    )
    negative_prompt: str | None = Field(
        None, description="What to steer away from; enables CFG when true_cfg_scale > 1."
    )
    num_inference_steps: int | None = Field(
        None, ge=1, le=100, description="Denoising steps; default from the pipeline."
    )
    true_cfg_scale: float = Field(
        4.0, ge=1.0, le=20.0, description="CFG scale (used only with a negative_prompt)."
    )
    seed: int | None = Field(
        None, ge=0, lt=2**63, description="Seed of image i is seed + i; random if unset."
    )
    user: str | None = Field(None, description="End-user id (accepted, not used).")
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="omni-serve extension: server-side deadline in seconds (capped by the "
        "server's api.request_timeout_s).",
    )

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must not be empty")
        return value


def parse_size(size: str, max_pixels: int) -> tuple[int, int]:
    """(width, height) from 'WxH', or ValueError with the reason."""
    try:
        width, height = (int(part) for part in size.lower().split("x"))
    except ValueError:
        raise ValueError(f"size must look like '512x512', got {size!r}") from None
    for side in (width, height):
        if side < MIN_SIDE or side % SIZE_MULTIPLE:
            raise ValueError(
                f"size {size!r}: each side must be a multiple of {SIZE_MULTIPLE}, >= {MIN_SIDE}"
            )
    if width * height > max_pixels:
        raise ValueError(f"size {size!r} is larger than this server allows ({max_pixels} pixels)")
    return width, height


def png_b64(image: np.ndarray) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
