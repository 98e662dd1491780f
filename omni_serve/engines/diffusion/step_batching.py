"""Step-level (continuous) batching for iterative denoisers.

With request-level batching a request that arrives while a batch denoises waits for the whole
batch (every one of its steps) before its own batch starts. Here the batch is re-formed before
every step: waiting jobs join it, finished ones leave it, cancelled ones are dropped, so a new
request starts at the next step and the denoiser never idles while anything is queued. Jobs that
cannot share a step (another image size) form their own groups, and the groups take turns one
step each, so no size starves another.

The loop runs on one thread (the model is not thread-safe); callers get a
``concurrent.futures.Future`` per job.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Job(Protocol):
    cancel: threading.Event  # set when nobody waits for the result any more


class State(Protocol):
    """What ``Stepper.start`` returns."""

    @property
    def done(self) -> bool: ...

    @property
    def batch_key(self) -> Hashable: ...


class Stepper(Protocol):
    def start(self, job: Any) -> Any: ...

    def step(self, states: list[Any]) -> None: ...


class JobCancelled(Exception):
    """The job was cancelled before it finished; its steps stopped."""


@dataclass
class StepBatchStats:
    steps: int = 0  # denoiser calls
    finished: int = 0
    cancelled: int = 0
    joined_running: int = 0  # jobs that joined a group already past its first step
    max_batch: int = 0
    busy_s: float = 0.0  # in the denoiser's calls (start and step)


@dataclass
class _Entry:
    job: Any
    future: concurrent.futures.Future
    state: Any = None
    steps: int = 0


class StepBatcher:
    """``stepper.start(job)`` makes a job's state (with ``done`` and ``batch_key``);
    ``stepper.step(states)`` advances states of one key by one step in one call; ``result``
    turns a finished state into what the job's future gets."""

    def __init__(
        self,
        stepper: Stepper,
        max_batch_size: int,
        result: Callable[[Any], Any] = lambda state: state,
        name: str = "dit",
        logger: logging.Logger = log,
    ) -> None:
        self.stepper = stepper
        self.log = logger
        self.max_batch_size = max_batch_size
        self.result = result
        self.stats = StepBatchStats()
        self._inbox: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self._waiting: dict[Hashable, deque[_Entry]] = {}
        self._running: dict[Hashable, list[_Entry]] = {}
        self._thread = threading.Thread(target=self._loop, name=f"{name}-steps", daemon=True)
        self._thread.start()

    def submit(self, job: Any) -> concurrent.futures.Future:
        """The job's result, or ``JobCancelled`` once ``job.cancel`` is set or the future is
        cancelled; an error in a step fails every job of that step."""
        entry = _Entry(job, concurrent.futures.Future())
        self._inbox.put(entry)
        return entry.future

    @property
    def active(self) -> int:
        """Jobs started and not finished (read from other threads: the values are copied in
        one step under the GIL while the loop may be changing the dict)."""
        return sum(len(group) for group in list(self._running.values()))

    def close(self) -> None:
        """Stops the loop after its current step; jobs still queued or running get
        ``JobCancelled``."""
        self._inbox.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            idle = not self._running and not any(self._waiting.values())
            if not self._receive(block=idle):
                break
            # Groups in a stable order (running ones first, as they started): each takes one
            # step per round, so no size gets two steps in a row while another waits.
            for key in list(dict.fromkeys([*self._running, *self._waiting])):
                self._admit(key)
                self._step(key)
        for entry in [e for g in [*self._running.values(), *self._waiting.values()] for e in g]:
            _settle(entry.future, exception=JobCancelled("the step batcher closed"))

    def _receive(self, block: bool) -> bool:
        """Moves new jobs to their key's queue; False once closed."""
        try:
            entry = self._inbox.get(block=block)
            while True:
                if entry is None:
                    return False
                try:
                    began = time.perf_counter()
                    try:
                        entry.state = self.stepper.start(entry.job)
                    finally:
                        self.stats.busy_s += time.perf_counter() - began
                except Exception as exc:  # a bad job fails alone
                    _settle(entry.future, exception=exc)
                else:
                    self._waiting.setdefault(entry.state.batch_key, deque()).append(entry)
                entry = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _admit(self, key: Hashable) -> None:
        running = [e for e in self._running.get(key, []) if not self._dropped(e)]
        waiting = self._waiting.get(key, deque())
        started = any(e.steps > 0 for e in running)
        joined = 0
        while waiting and len(running) < self.max_batch_size:
            entry = waiting.popleft()
            if not self._dropped(entry):
                running.append(entry)
                joined += 1
        if joined:
            self.stats.joined_running += joined if started else 0
            self.log.info(
                "step batch %s: %d job(s) running, %d joined%s",
                key,
                len(running),
                joined,
                " a running batch" if started else "",
            )
        if not waiting:
            self._waiting.pop(key, None)
        if running:
            self._running[key] = running
        else:
            self._running.pop(key, None)

    def _dropped(self, entry: _Entry) -> bool:
        if entry.job.cancel.is_set() or entry.future.cancelled():
            self.stats.cancelled += 1
            _settle(entry.future, exception=JobCancelled("cancelled"))
            return True
        return False

    def _step(self, key: Hashable) -> None:
        group = self._running.get(key)
        if not group:
            return
        began = time.perf_counter()
        try:
            self.stepper.step([e.state for e in group])
        except Exception as exc:
            self.stats.busy_s += time.perf_counter() - began
            log.exception("denoising step failed for %d job(s)", len(group))
            for entry in group:
                _settle(entry.future, exception=exc)
            del self._running[key]
            return
        self.stats.busy_s += time.perf_counter() - began
        self.stats.steps += 1
        self.stats.max_batch = max(self.stats.max_batch, len(group))
        still = []
        for entry in group:
            entry.steps += 1
            if entry.state.done:
                self.stats.finished += 1
                _settle(entry.future, result=self.result(entry.state))
            else:
                still.append(entry)
        self._running[key] = still


def _settle(
    future: concurrent.futures.Future, result: Any = None, exception: BaseException | None = None
) -> None:
    """Sets a future the caller may have cancelled meanwhile (then nobody reads it)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
