"""Code2wav's SnakeBeta activation with one temporary tensor instead of five.

transformers computes ``x + 1/(exp(beta) + eps) * sin(x * exp(alpha)) ** 2`` op by op, each op
allocating and writing a new sample-rate tensor. The same ops in place on one temporary give
the same numbers (bit-identical, measured) in about half the time: on the small preset the 29
activations took 37 ms of a 32-frame chunk's decode, 20.5 ms in place (one core).
"""

from __future__ import annotations

import torch
from torch import nn


class InPlaceSnakeBeta(nn.Module):
    """Same parameters and result as ``Qwen3OmniMoeSnakeBeta``; in place when not training."""

    def __init__(self, snake: nn.Module) -> None:
        super().__init__()
        self.alpha = snake.alpha
        self.beta = snake.beta
        self.no_div_by_zero = snake.no_div_by_zero

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]  # line up with x: [B, C, T]
        inv_beta = (1.0 / (self.beta.exp() + self.no_div_by_zero))[None, :, None]
        if torch.is_grad_enabled() and hidden_states.requires_grad:  # autograd: out of place
            return hidden_states + inv_beta * torch.sin(hidden_states * alpha).pow(2)
        out = hidden_states * alpha
        out.sin_().square_().mul_(inv_beta).add_(hidden_states)
        return out


def use_in_place_snake(model: nn.Module) -> int:
    """Swap every SnakeBeta of ``model`` (a Code2wav) for ``InPlaceSnakeBeta``; returns how many."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeSnakeBeta,
    )

    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, Qwen3OmniMoeSnakeBeta)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, InPlaceSnakeBeta(child))
    return len(swaps)
