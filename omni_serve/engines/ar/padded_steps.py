"""What a Talker runner shares when its decode step is a static-shape
``step(slot_idx [B], text [B, H], window) -> [B, ...]`` over a ``SlotKVCache`` with a spare
slot: the batch padded to a bucket and the KV window rounded up to one (outside ``eager``),
the graphs of every bucket captured before any request, and a step's one copy off the device.

A runner mixes this in, sets ``cache`` (with its spare slot), ``device``, ``dtype`` and
``pad_row`` (what a row past its text, and a padding row, reads), then calls ``_use_step``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.step_graphs import (
    GraphMode,
    StepGraphs,
    batch_buckets,
    bucket,
    length_buckets,
)

logger = logging.getLogger(__name__)
Runner = TypeVar("Runner", bound="PaddedSteps")


def captured(runner: Runner) -> Runner:
    """``runner`` with every bucket's CUDA graph captured before it serves (how many, and how
    long that took, logged): the Talker stages' start-up under ``engine.cuda_graphs``."""
    started = time.perf_counter()
    graphs = runner.capture()
    logger.info("Talker: %d CUDA graphs captured in %.1f s", graphs, time.perf_counter() - started)
    return runner


class PaddedSteps:
    cache: SlotKVCache
    device: torch.device
    dtype: torch.dtype
    pad_row: torch.Tensor

    def _use_step(
        self,
        step: Callable[..., torch.Tensor],
        graph_mode: GraphMode,
        compile_backend: str,
        max_batch_size: int,
        max_len: int,
    ) -> None:
        self.padded = graph_mode != "eager"
        self.batch_buckets = batch_buckets(max_batch_size)
        self.window_buckets = length_buckets(max_len)
        self.graphs = StepGraphs(step, graph_mode, self._scratch_inputs, backend=compile_backend)

    def capture(self, rows: Sequence[int] = (), longest: int | None = None) -> int:
        """Captures, before any request, the graphs of the batch buckets that hold ``rows``
        (every bucket if empty) times the window buckets up to the one that holds
        ``longest`` (the KV cache's length if None), largest first so the smaller ones reuse
        its memory, as vLLM does at start-up. A bucket first met mid-reply would stall every
        row of that step for its capture (two eager warm-up steps and the capture itself).
        Returns how many graphs are held."""
        if self.graphs.mode != "cuda_graph":
            return 0
        sizes = sorted({bucket(r, self.batch_buckets) for r in rows} or set(self.batch_buckets))
        last = bucket(longest or self.cache.max_len, self.window_buckets)
        windows = [w for w in self.window_buckets if w <= last]
        hidden = self.pad_row.shape[-1]
        for size in reversed(sizes):
            slot_idx = torch.full((size,), self.cache.spare_slot, device=self.device)
            text = torch.zeros(size, hidden, dtype=self.dtype, device=self.device)
            for window in reversed(windows):
                self.graphs.capture((slot_idx, text), (window,))
        return self.graphs.captured

    def _step_rows(self, states: list[Any]) -> torch.Tensor:
        """One step for ``states`` (each with ``slot`` and a ``trailing`` deque of text rows),
        padded; their rows of the step's output, on the host (the step's one copy)."""
        rows = len(states)
        longest = max(self.cache.lengths[s.slot] for s in states) + 1
        if longest > self.cache.max_len:
            raise RuntimeError(f"sequence longer than the KV cache ({self.cache.max_len})")
        size = bucket(rows, self.batch_buckets) if self.padded else rows
        window = bucket(longest, self.window_buckets) if self.padded else longest
        slot_ids = [s.slot for s in states] + [self.cache.spare_slot] * (size - rows)
        text = [s.trailing.popleft() if s.trailing else self.pad_row for s in states]
        text += [self.pad_row] * (size - rows)
        slot_idx = torch.tensor(slot_ids).to(self.device, non_blocking=True)
        text_rows = torch.stack([t.to(self.device, self.dtype) for t in text])
        out = self.graphs.run((slot_idx, text_rows), (window,)).cpu()
        for state in states:
            self.cache.lengths[state.slot] += 1
        return out[:rows]

    def _scratch_inputs(
        self, inputs: tuple[torch.Tensor, ...], static: tuple[int, ...]
    ) -> tuple[torch.Tensor, ...]:
        """Inputs to capture a bucket on: every row on the spare slot, whose writes are
        harmless."""
        slot_idx, text_rows = inputs
        return torch.full_like(slot_idx, self.cache.spare_slot), torch.zeros_like(text_rows)
