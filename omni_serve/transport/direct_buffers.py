"""The direct backend's memory records: what an owner keeps per buffer, what a ref carries.

A buffer starts with a 64-byte header (generation, state), written by its owner before the
payload; a reader checks it before and after reading (see ``direct``)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

HEADER = struct.Struct("<QQ")  # generation, state
FREE, IN_USE = 0, 1


@dataclass(frozen=True)
class Where:
    """What a consumer needs to read a payload: rides the handle call inside the ref."""

    agent: str
    metadata: bytes  # the owner's NIXL metadata when it registered this buffer
    metadata_version: int
    dropped: int  # buffers the owner had deregistered when it made this ref
    buffer: int
    address: int
    mem_type: str  # "DRAM" or "VRAM"
    device_id: int
    generation: int
    size: int
    offsets: dict[str, tuple[int, int]]
    keys: list[Any] | None


@dataclass
class Buffer:
    index: int
    memory: torch.Tensor  # uint8; registered with the agent
    registration: Any
    pooled: bool
    generation: int = 0
    state: int = FREE
    since: float = 0.0

    def mark(self, state: int) -> None:
        self.state, self.since = state, time.time()
        header = torch.tensor([self.generation, state], dtype=torch.int64)  # = HEADER on x86
        self.memory[: HEADER.size].copy_(header.view(torch.uint8))


@dataclass
class Lent:
    """Memory another backend owns and lends to readers on other hosts (a pooled
    shared-memory segment): its header is this backend's, its state that backend's to keep."""

    memory: torch.Tensor
    registration: Any
    in_use: Callable[[], bool]  # a reader may come: the owner loop keeps its busy pace
    release: Callable[[str, int], None]  # (verb: "free" or "abandon", generation)


def allocate(nbytes: int, device: torch.device) -> torch.Tensor:
    """A zeroed buffer; on a GPU outside torch's allocator, whose expandable segments other
    processes cannot read over CUDA IPC (see ``compat.nixl.gpu_buffer``)."""
    if device.type != "cuda":
        return torch.zeros(nbytes, dtype=torch.uint8)
    from omni_serve.compat.nixl import gpu_buffer

    return gpu_buffer(nbytes, device.index).zero_()


def nixl_mem_type(device: torch.device) -> tuple[str, int]:
    return ("VRAM", device.index or 0) if device.type == "cuda" else ("DRAM", 0)
