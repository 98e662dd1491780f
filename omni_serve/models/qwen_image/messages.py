"""What Qwen-Image's stages send each other over Serve handles (besides channel refs)."""

from __future__ import annotations

from dataclasses import dataclass

from omni_serve.transport.base import TensorRef


@dataclass(slots=True)
class DenoiseRequest:
    """One request's images for the DiT: its prompt's (and negative prompt's) rows from the
    text encoder, by channel ref, and one image per seed."""

    prompt: TensorRef
    negative: TensorRef | None
    height: int
    width: int
    steps: int
    true_cfg_scale: float
    seeds: list[int]
