from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from omni_serve.api.images import ImageGenerationRequest, images_b64, parse_size


def test_parse_size_accepts_multiples_of_16_within_the_limit():
    assert parse_size("96x64", 1024 * 1024) == (96, 64)
    assert parse_size("1024X1024", 1024 * 1024) == (1024, 1024)


@pytest.mark.parametrize(
    ("size", "fragment"),
    [
        ("100x64", "multiple of 16"),
        ("32x64", ">= 64"),
        ("64", "look like"),
        ("axb", "look like"),
        ("2048x2048", "larger than"),
    ],
)
def test_parse_size_says_why_it_rejects(size, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_size(size, 1024 * 1024)


def test_request_rejects_blank_prompt_and_unknown_fields():
    with pytest.raises(ValidationError, match="must not be empty"):
        ImageGenerationRequest(prompt="   ")
    with pytest.raises(ValidationError):
        ImageGenerationRequest(prompt="x", style="vivid")
    assert ImageGenerationRequest(prompt="x").n == 1


def test_size_auto_is_the_pipelines_default_as_openais_gpt_image_default_is():
    for size in ("auto", "AUTO", None):
        assert ImageGenerationRequest(prompt="x", size=size).size is None
    assert ImageGenerationRequest(prompt="x", size="512x256").size == "512x256"


def _gradient(width: int = 96, height: int = 64) -> np.ndarray:
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    return np.broadcast_to((x + y) / 2, (height, width, 3)).astype(np.uint8)


def _decoded(data: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_images_encode_as_asked_png_exactly_jpeg_and_webp_by_quality():
    image = _gradient()
    (png,) = images_b64([image])
    assert _decoded(png).format == "PNG" and np.array_equal(np.asarray(_decoded(png)), image)
    for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP")):
        best, rough = images_b64([image, image], fmt, None)[0], images_b64([image], fmt, 5)[0]
        assert _decoded(best).format == pil and _decoded(best).size == (96, 64)
        assert len(base64.b64decode(rough)) < len(base64.b64decode(best))  # quality 100 by default
        error = np.abs(np.asarray(_decoded(best).convert("RGB"), np.int16) - image).max()
        assert error <= 8, (fmt, error)


def test_output_compression_is_for_lossy_formats_and_openais_other_ids_are_taken():
    with pytest.raises(ValidationError, match="applies to jpeg and webp, not png"):
        ImageGenerationRequest(prompt="x", output_compression=50)
    with pytest.raises(ValidationError):
        ImageGenerationRequest(prompt="x", output_format="gif")
    taken = ImageGenerationRequest(
        prompt="x", output_format="webp", output_compression=80, safety_identifier="u-1"
    )
    assert (taken.output_format, taken.output_compression) == ("webp", 80)
