"""The torch reference AR engine: continuous batching over a slot KV cache.

Used where vLLM has no model (the Qwen3-Omni Talker with its code predictor) and in fast
tests. The engine owns scheduling (admission, batching, stop conditions, cancellation,
streaming); a model-specific ``StepRunner`` owns the math. Steps run on one worker thread so
the event loop stays free for I/O while torch computes.

A request may be fed inputs while it runs (``feed``): its runner says when it is ``ready`` for
the next step, which is how the Talker follows a Thinker that is still generating.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from omni_serve.engines.ar.base import ARChunk, ARRequest
from omni_serve.engines.ar.sampling import sample_one

log = logging.getLogger(__name__)

# ``ARRequest.extra`` key: ids the repetition penalty counts as seen before the first token
# (transformers' generate counts its input ids: a Talker prompt's codec ids, say).
PENALTY_HISTORY = "penalty_history"


@dataclass
class StepOutput:
    """One request's result of a prefill or decode step: the logits the engine samples the
    next token from, or the ``token`` a runner that samples on its device already drew."""

    logits: torch.Tensor | None = None  # [V] for the next token
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. {"codes": [16]}
    token: int | None = None


class StepRunner(Protocol):
    max_batch_size: int

    def new_state(self, request: ARRequest) -> Any:
        """Validate a request and build its per-request state (raises ValueError if bad)."""

    def can_admit(self) -> bool:
        """Whether there is room (a KV slot) to prefill one more request."""

    def feed(self, state: Any, item: Any) -> None:
        """Give a running request more input."""

    def ready(self, state: Any) -> bool:
        """Whether the request has the input its next decode step needs."""

    def prefill(self, state: Any) -> StepOutput: ...

    def decode(self, states: list[Any], last_tokens: list[int]) -> list[StepOutput]: ...

    def release(self, state: Any) -> None: ...

    def suppress_tokens(self, state: Any) -> torch.Tensor | None: ...


@dataclass
class EngineStats:
    """Where the engine's time goes, for a stage's ``stats()`` and Prometheus: busy seconds
    per phase against wall time tell how close to saturation the stage runs. Counts and sums
    only: a long-running engine must not keep one entry per step."""

    steps: int = 0  # decode steps
    max_batch: int = 0  # the largest decode batch so far
    decode_rows: int = 0  # rows over all decode steps (/ steps = mean batch)
    prefills: int = 0
    prefill_s: float = 0.0  # in the runner's prefill
    decode_s: float = 0.0  # in the runner's decode
    emit_s: float = 0.0  # sampling and handing chunks out, on the event loop

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class _Sequence:
    request: ARRequest
    state: Any
    queue: asyncio.Queue
    generated: list[int] = field(default_factory=list)
    history: list[int] = field(default_factory=list)  # seen before the first token
    prefilled: bool = False
    done: bool = False
    generator: torch.Generator | None = None


_FINISHED = object()


class TorchAREngine:
    def __init__(self, runner: StepRunner, stop_token_ids: tuple[int, ...] = ()) -> None:
        self.runner = runner
        self.stop_token_ids = set(stop_token_ids)
        self._sequences: dict[str, _Sequence] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch-ar")
        self.stats = EngineStats()
        self._stepping: list[Any] = []  # the states the step running now reads
        self._release_after_step: list[Any] = []

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    @property
    def num_running(self) -> int:
        return len(self._sequences)

    def generate(self, request: ARRequest) -> AsyncIterator[ARChunk]:
        """Register the request now (so ``feed`` works at once) and return its chunk stream."""
        if request.request_id in self._sequences:
            raise ValueError(f"request id {request.request_id!r} is already running")
        if request.sampling.text_level:
            raise ValueError(
                f"{', '.join(request.sampling.text_level)}: text-level settings, "
                "which the torch engine (it makes no text) does not take"
            )
        seq = _Sequence(request, self.runner.new_state(request), asyncio.Queue())
        seq.history = list(request.extra.get(PENALTY_HISTORY, ()))
        if request.sampling.seed is not None:
            seq.generator = torch.Generator().manual_seed(request.sampling.seed)
        self._sequences[request.request_id] = seq
        self._wake.set()
        return self._stream(seq)

    async def _stream(self, seq: _Sequence) -> AsyncIterator[ARChunk]:
        try:
            while True:
                item = await seq.queue.get()
                if item is _FINISHED:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._drop(seq)

    def feed(self, request_id: str, item: Any) -> bool:
        """Give a running request more input. False when it is not running: it ended on its
        own (a stop token, ``max_tokens``) or was aborted, which its feeder cannot know in
        time (the engine's loop ends it between two feeds), so the input is dropped."""
        seq = self._sequences.get(request_id)
        if seq is None:
            return False
        self.runner.feed(seq.state, item)
        self._wake.set()
        return True

    async def abort(self, request_id: str) -> None:
        seq = self._sequences.get(request_id)
        if seq is not None:
            self._drop(seq)
            seq.queue.put_nowait(_FINISHED)

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None
        for seq in list(self._sequences.values()):
            self._drop(seq)
            seq.queue.put_nowait(RuntimeError("engine shut down"))
        self._executor.shutdown(wait=False)

    # -- scheduling ----------------------------------------------------------------------

    def _drop(self, seq: _Sequence) -> None:
        if self._sequences.get(seq.request.request_id) is seq:
            del self._sequences[seq.request.request_id]
            if any(seq.state is state for state in self._stepping):  # the step's thread reads it
                self._release_after_step.append(seq.state)
            else:
                self.runner.release(seq.state)

    async def _step(self, fn: Any, *args: Any, states: list[Any]) -> Any:
        """``fn`` on the step thread. A request aborted meanwhile (the event loop runs on)
        keeps its state, slot and KV until the step is done with them."""
        self._stepping = states
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self._stepping = []
            released, self._release_after_step = self._release_after_step, []
            for state in released:
                self.runner.release(state)

    async def _run(self) -> None:
        while True:
            pending = [s for s in self._sequences.values() if not s.prefilled]
            if not self.runner.can_admit():
                pending = []
            runnable = [
                s for s in self._sequences.values() if s.prefilled and self.runner.ready(s.state)
            ][: self.runner.max_batch_size]
            if not pending and not runnable:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                stats = self.stats
                if pending:
                    seq = pending[0]
                    start = time.perf_counter()
                    out = await self._step(self.runner.prefill, seq.state, states=[seq.state])
                    middle = time.perf_counter()
                    seq.prefilled = True
                    self._emit(seq, out)
                    stats.prefills += 1
                    stats.prefill_s += middle - start
                    stats.emit_s += time.perf_counter() - middle
                if runnable:
                    runnable = [s for s in runnable if s.request.request_id in self._sequences]
                    last = [s.generated[-1] for s in runnable]
                    states = [s.state for s in runnable]
                    start = time.perf_counter()
                    outs = await self._step(self.runner.decode, states, last, states=states)
                    middle = time.perf_counter()
                    for seq, out in zip(runnable, outs, strict=True):
                        self._emit(seq, out)
                    stats.steps += 1
                    stats.max_batch = max(stats.max_batch, len(runnable))
                    stats.decode_rows += len(runnable)
                    stats.decode_s += middle - start
                    stats.emit_s += time.perf_counter() - middle
            except Exception as exc:  # fail the affected requests, keep the engine alive
                log.exception("torch engine step failed")
                for seq in (pending[:1] if pending else []) + runnable:
                    self._drop(seq)
                    seq.queue.put_nowait(exc)
            await asyncio.sleep(0)

    def _emit(self, seq: _Sequence, out: StepOutput) -> None:
        if seq.request.request_id not in self._sequences:
            return  # aborted while the step ran
        sampling = seq.request.sampling
        token = out.token
        if token is None:
            suppress = self.runner.suppress_tokens(seq.state)
            seen = seq.history + seq.generated if seq.history else seq.generated
            token = sample_one(out.logits, sampling, seen, suppress, seq.generator)
        seq.generated.append(token)
        stop_ids = self.stop_token_ids | set(sampling.stop_token_ids)
        reason = None
        if token in stop_ids:
            reason = "stop"
        elif len(seq.generated) >= sampling.max_tokens:
            reason = "length"
        chunk = ARChunk(
            request_id=seq.request.request_id,
            token_ids=[token],
            finished=reason is not None,
            finish_reason=reason,
            outputs=dict(out.outputs),
        )
        seq.queue.put_nowait(chunk)
        if reason is not None:
            self._drop(seq)
            seq.queue.put_nowait(_FINISHED)
