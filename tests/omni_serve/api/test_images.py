from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_serve.api.images import ImageGenerationRequest, parse_size


def test_parse_size_accepts_multiples_of_16_within_the_limit():
    assert parse_size("96x64", 1024 * 1024) == (96, 64)
    assert parse_size("1024X1024", 1024 * 1024) == (1024, 1024)


@pytest.mark.parametrize(
    ("size", "fragment"),
    [("100x64", "multiple of 16"), ("32x64", ">= 64"), ("64", "look like"),
     ("axb", "look like"), ("2048x2048", "larger than")],
)  # fmt: skip
def test_parse_size_says_why_it_rejects(size, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_size(size, 1024 * 1024)


def test_request_rejects_blank_prompt_and_unknown_fields():
    with pytest.raises(ValidationError, match="must not be empty"):
        ImageGenerationRequest(prompt="   ")
    with pytest.raises(ValidationError):
        ImageGenerationRequest(prompt="x", style="vivid")
    assert ImageGenerationRequest(prompt="x").n == 1
