"""The in-place SnakeBeta gives Code2wav the same audio as transformers' own activation."""

from __future__ import annotations

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeSnakeBeta

from omni_serve.models.qwen3_omni.checkpoint import load_code2wav
from omni_serve.models.qwen3_omni.snake import InPlaceSnakeBeta, use_in_place_snake


def test_code2wav_with_in_place_snake_decodes_the_same_audio(tiny_omni_path):
    original, _ = load_code2wav(tiny_omni_path, torch.float32)
    swapped, _ = load_code2wav(tiny_omni_path, torch.float32)
    count = use_in_place_snake(swapped)
    assert count > 0 and count == sum(isinstance(m, InPlaceSnakeBeta) for m in swapped.modules())
    assert not any(isinstance(m, Qwen3OmniMoeSnakeBeta) for m in swapped.modules())
    codes = torch.randint(0, 2048, (1, 16, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(swapped(codes), original(codes), atol=1e-6, rtol=0)


def test_the_activation_matches_with_and_without_autograd():
    snake = Qwen3OmniMoeSnakeBeta(8)
    with torch.no_grad():
        snake.alpha.normal_()
        snake.beta.normal_()
    x = torch.randn(2, 8, 50, requires_grad=True)
    fast = InPlaceSnakeBeta(snake)
    torch.testing.assert_close(fast(x), snake(x))  # autograd on: the out-of-place path
    fast(x).sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), snake(x), atol=0, rtol=0)
