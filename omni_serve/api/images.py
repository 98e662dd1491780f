"""``POST /v1/images/generations``: the OpenAI request shape plus diffusion extensions, its
validation (every bad value is a 400 naming the field), and the encoding of the results."""

from __future__ import annotations

import base64
import io
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ImageFormat = Literal["png", "jpeg", "webp"]
_PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
SIZE_MULTIPLE = 16  # the VAE downsamples 8x and the DiT packs 2x2 latent patches
MIN_SIDE = 64


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="What to draw.", max_length=4000)
    model: str | None = Field(None, description="Served model name (optional; one is served).")
    n: int = Field(1, ge=1, le=4, description="Images to generate for the prompt.")
    size: str | None = Field(
        None,
        description="'WIDTHxHEIGHT', both multiples of 16; 'auto' or none: the pipeline's default.",
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
    output_format: ImageFormat = Field("png", description="Encoding of the returned images.")
    output_compression: int | None = Field(
        None, ge=0, le=100, description="jpeg/webp quality, 0-100 (100 by default, as OpenAI's)."
    )
    user: str | None = Field(None, description="End-user id (accepted, not used).")
    safety_identifier: str | None = Field(
        None, description="OpenAI's end-user id for abuse checks (accepted, not used)."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="omni-serve extension: server-side deadline in seconds (capped by the "
        "server's api.request_timeout_s).",
    )

    @field_validator("size")
    @classmethod
    def _auto_is_the_default(cls, value: str | None) -> str | None:
        # OpenAI's gpt-image models default to size "auto": the server picks.
        return None if value is not None and value.lower() == "auto" else value

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must not be empty")
        return value

    @model_validator(mode="after")
    def _compression_is_lossy(self) -> ImageGenerationRequest:
        if self.output_compression is not None and self.output_format == "png":
            raise ValueError("output_compression applies to jpeg and webp, not png (lossless)")
        return self


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


def images_b64(
    images: list[np.ndarray], fmt: ImageFormat = "png", quality: int | None = None
) -> list[str]:
    """The images encoded, base64. Seconds of CPU for a few large images (a 1024x1024 PNG
    of noise ~110 ms): an ingress calls this in a worker thread, off its event loop."""
    from PIL import Image

    options = {} if fmt == "png" else {"quality": 100 if quality is None else quality}
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format=_PIL_FORMATS[fmt], **options)
        encoded.append(base64.b64encode(buffer.getvalue()).decode())
    return encoded
