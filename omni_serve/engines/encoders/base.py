"""Encoder engines: a multimodal tower run on its own, off the event loop.

The encoders are a separate stage from the Thinker so that they scale, batch and sit on
devices of their own; what they return is what the Thinker merges into its input embeddings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch


@dataclass
class EncoderOutput:
    embeds: torch.Tensor  # [N, H]: one row per placeholder token in the prompt
    # Extra per-layer features the Thinker adds to early hidden states (Qwen3-VL "deepstack").
    deepstack: list[torch.Tensor] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. grid_thw, feature lengths


Output = TypeVar("Output")


class TorchEncoderEngine(Generic[Output]):
    """Runs ``encode_fn(**inputs)`` (an ``EncoderOutput``, or rows per item) on one worker
    thread under no_grad."""

    def __init__(self, encode_fn: Callable[..., Output]) -> None:
        self._encode = encode_fn
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="encoder")

    def encode_sync(self, **inputs: Any) -> Output:
        with torch.no_grad():
            return self._encode(**inputs)

    async def encode(self, **inputs: Any) -> Output:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.encode_sync(**inputs))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)
