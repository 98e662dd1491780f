"""Running a static-shape step function per shape bucket: eagerly, compiled, or replayed
from CUDA graphs.

A decode step that launches thousands of small kernels is bound by the host on a GPU; a CUDA
graph records its launches once per input shape and replays them with one call. Shapes vary
with the batch and the longest sequence, so callers round both up to a few buckets (as vLLM
and gpt-fast do) and keep one graph per bucket. All graphs share one memory pool: only one
replays at a time.

Modes:
- ``eager``: call the function (the reference, and the CPU path).
- ``compile``: ``torch.compile(fullgraph=True)``, with ``mode="reduce-overhead"`` (inductor's
  own CUDA graphs) on a GPU.
- ``cuda_graph``: capture the eager function with ``torch.cuda.CUDAGraph`` per bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

GraphMode = Literal["eager", "compile", "cuda_graph"]


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (which is always a bucket)."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if (1 << i) < max_batch]
    return [*sizes, max_batch]


def length_buckets(max_len: int, smallest: int = 64) -> list[int]:
    """``smallest``, doubling, up to ``max_len`` (always a bucket)."""
    sizes, size = [], smallest
    while size < max_len:
        sizes.append(size)
        size *= 2
    return [*sizes, max_len]


def bucket(size: int, buckets: Sequence[int]) -> int:
    for candidate in buckets:
        if size <= candidate:
            return candidate
    raise ValueError(f"{size} is past the largest bucket ({buckets[-1]})")


Inputs = tuple[torch.Tensor, ...]
CapturedStep = tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]  # graph, inputs, output


class StepGraphs:
    """``run(inputs, static)`` calls ``fn(*inputs, *static)``; ``static`` (ints) and the
    inputs' shapes make the bucket.

    In ``cuda_graph`` mode the first call for a bucket captures a graph on
    ``safe_inputs(inputs, static)``: inputs of the same shapes on which running the step is
    harmless (a step writing only scratch state), since the warm-up runs execute. Later calls
    copy the inputs into the captured ones and replay; the result is the graph's own output
    buffer, valid until the next ``run``."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        mode: GraphMode,
        safe_inputs: Callable[[Inputs, tuple[int, ...]], Inputs] | None = None,
        warmup: int = 2,
        backend: str = "inductor",
    ) -> None:
        """``backend``: torch.compile's, in ``compile`` mode (``aot_eager`` traces the same
        graph without generating code: what CPU tests use)."""
        if mode not in ("eager", "compile", "cuda_graph"):
            raise ValueError(f"unknown graph mode {mode!r}")
        if mode == "cuda_graph" and (safe_inputs is None or not torch.cuda.is_available()):
            raise ValueError("cuda_graph mode needs CUDA and safe_inputs")
        self.mode = mode
        self.fn = fn
        self.safe_inputs = safe_inputs
        self.warmup = warmup
        self._graphs: dict[tuple, CapturedStep] = {}
        self._pool = None
        if mode == "compile":
            cuda = torch.cuda.is_available()
            mode = "reduce-overhead" if cuda and backend == "inductor" else None
            self.fn = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend, mode=mode)

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def run(self, inputs: Inputs, static: tuple[int, ...] = ()) -> torch.Tensor:
        if self.mode != "cuda_graph":
            return self.fn(*inputs, *static)
        graph, captured, out = self.capture(inputs, static)
        for target, given in zip(captured, inputs, strict=True):
            target.copy_(given, non_blocking=True)
        graph.replay()
        return out

    def capture(self, inputs: Inputs, static: tuple[int, ...] = ()) -> CapturedStep:
        """The bucket's graph, captured now if it is new (``inputs`` give only the shapes)."""
        key = (tuple(tuple(t.shape) for t in inputs), static)
        if key not in self._graphs:
            self._graphs[key] = self._capture(self.safe_inputs(inputs, static), static)
        return self._graphs[key]

    def _capture(self, inputs: Inputs, static: tuple[int, ...]) -> CapturedStep:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn(*inputs, *static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.fn(*inputs, *static)
        if self._pool is None:
            self._pool = graph.pool()
        return graph, inputs, out
