"""Deterministic random init that gives non-degenerate outputs.

HF's default init (normal, std 0.02) leaves deep random stacks nearly silent: Qwen3-Omni's
code2wav outputs ~4e-7 amplitude. Scaling every weight matrix by 1/sqrt(fan_in) keeps
activations at unit scale through the stack, so audio is audible and images have structure.
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def fan_in_init(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.dim() >= 2:
            fan_in = math.prod(param.shape[1:])
            if isinstance(_owner(model, name), nn.Embedding):
                continue  # embeddings keep the model's own init (std 0.02)
            param.copy_(torch.randn(param.shape, generator=gen) / math.sqrt(fan_in))
        elif name.endswith("bias"):
            param.zero_()
        # 1-D non-bias params (norm weights, SnakeBeta alphas, layer scales) keep module defaults.


def _owner(model: nn.Module, param_name: str) -> nn.Module:
    return model.get_submodule(param_name.rsplit(".", 1)[0]) if "." in param_name else model
