"""Step-level batching: jobs join a running batch between steps, leave when done, are dropped
when cancelled; sizes take turns; a failing step fails only its own jobs. (The denoiser here
counts steps, so the tests see the schedule; tests/omni_serve/models/qwen_image/test_stages.py
runs the real tiny DiT through the batcher.)"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from omni_serve.engines.diffusion.step_batching import JobCancelled, StepBatcher


@dataclass
class CountJob:
    name: str
    steps: int
    key: str = "64x64"
    fail: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class CountState:
    job: CountJob
    index: int = 0

    @property
    def done(self) -> bool:
        return self.index >= self.job.steps

    @property
    def batch_key(self) -> str:
        return self.job.key


class CountingStepper:
    """Records the jobs of every step; with ``gated`` each step waits for ``release``."""

    def __init__(self, gated: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Semaphore(0) if gated else None

    def start(self, job: CountJob) -> CountState:
        if job.steps < 1:
            raise ValueError("a job needs a step")
        return CountState(job)

    def step(self, states: list[CountState]) -> None:
        if self.gate is not None:
            assert self.gate.acquire(timeout=10), "the test never released this step"
        if any(s.job.fail for s in states):
            raise RuntimeError("step failed")
        self.calls.append([s.job.name for s in states])
        for s in states:
            s.index += 1

    def release(self, steps: int) -> None:
        for _ in range(steps):
            self.gate.release()

    def wait_calls(self, n: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.calls) < n:
            assert time.monotonic() < deadline, self.calls
            time.sleep(0.001)


def result(state: CountState) -> tuple[str, int]:
    return state.job.name, state.index


@pytest.fixture
def gated():
    stepper = CountingStepper(gated=True)
    batcher = StepBatcher(stepper, max_batch_size=4, result=result)
    yield stepper, batcher
    stepper.release(100)
    batcher.close()


def test_a_job_joins_a_running_batch_and_leaves_when_done(gated):
    stepper, batcher = gated
    first = batcher.submit(CountJob("a", steps=3))
    stepper.release(1)
    stepper.wait_calls(1)
    second = batcher.submit(CountJob("b", steps=2))  # arrives while "a" is mid-way
    stepper.release(10)
    assert first.result(timeout=10) == ("a", 3) and second.result(timeout=10) == ("b", 2)
    assert ["a", "b"] in stepper.calls  # shared a step with the running job
    assert stepper.calls[0] == ["a"] and stepper.calls[-1] == ["b"]  # b finished after a left
    assert len(stepper.calls) in (3, 4)  # never a step for nothing
    assert batcher.stats.joined_running == 1 and batcher.stats.finished == 2


def test_a_cancelled_job_is_dropped_between_steps_and_the_others_go_on(gated):
    stepper, batcher = gated
    job = CountJob("gone", steps=50)
    cancelled = batcher.submit(job)
    kept = batcher.submit(CountJob("kept", steps=4))
    stepper.release(2)
    stepper.wait_calls(2)
    job.cancel.set()
    stepper.release(10)
    assert kept.result(timeout=10) == ("kept", 4)
    with pytest.raises(JobCancelled):
        cancelled.result(timeout=10)
    assert sum("gone" in call for call in stepper.calls) <= 3  # at most the step in flight
    assert batcher.stats.cancelled == 1 and batcher.active == 0


def test_a_future_cancelled_by_its_caller_stops_the_job():
    stepper = CountingStepper()
    batcher = StepBatcher(stepper, max_batch_size=1, result=result)
    busy = batcher.submit(CountJob("busy", steps=10**6))
    waiting = batcher.submit(CountJob("waiting", steps=5))
    assert waiting.cancel()  # asyncio.wrap_future does this when the awaiting task is cancelled
    busy.cancel()
    stepper_calls_then = len(stepper.calls)
    batcher.submit(CountJob("next", steps=1)).result(timeout=10)
    assert not any("waiting" in call for call in stepper.calls)
    assert len(stepper.calls) < stepper_calls_then + 10**5
    batcher.close()


def test_sizes_take_turns_and_a_step_holds_at_most_max_batch_size():
    stepper = CountingStepper(gated=True)
    batcher = StepBatcher(stepper, max_batch_size=2, result=result)
    blocker = batcher.submit(CountJob("blocker", steps=1, key="32x32"))
    stepper.wait_calls(0)
    time.sleep(0.1)  # the blocker's step waits at the gate: the four below queue meanwhile
    futures = [batcher.submit(CountJob(f"s{i}", steps=2)) for i in range(3)]
    futures.append(batcher.submit(CountJob("big", steps=2, key="128x128")))
    stepper.release(100)
    for f in [blocker, *futures]:
        f.result(timeout=10)
    batcher.close()
    assert stepper.calls[0] == ["blocker"]
    assert max(len(call) for call in stepper.calls) == 2
    kinds = ["big" if call == ["big"] else "small" for call in stepper.calls[1:]]
    assert kinds[:4] in (["small", "big"] * 2, ["big", "small"] * 2)  # alternating
    assert batcher.stats.max_batch == 2


def test_a_failing_step_fails_its_jobs_only_and_the_loop_goes_on():
    stepper = CountingStepper()
    batcher = StepBatcher(stepper, max_batch_size=4, result=result)
    bad = batcher.submit(CountJob("bad", steps=3, fail=True))
    with pytest.raises(RuntimeError, match="step failed"):
        bad.result(timeout=10)
    with pytest.raises(ValueError, match="needs a step"):  # a job that cannot start
        batcher.submit(CountJob("empty", steps=0)).result(timeout=10)
    assert batcher.submit(CountJob("good", steps=2)).result(timeout=10) == ("good", 2)
    batcher.close()


def test_close_cancels_the_jobs_still_running():
    stepper = CountingStepper()
    batcher = StepBatcher(stepper, max_batch_size=4, result=result)
    running = batcher.submit(CountJob("long", steps=10**7))
    batcher.close()
    assert isinstance(running.exception(timeout=0), JobCancelled)
    assert not batcher._thread.is_alive()


def test_the_busy_time_counts_the_denoisers_calls_only():
    """``stats.busy_s``: the DiT's busy seconds on /metrics (its rate is how saturated the stage
    is); time waiting for jobs is not busy."""

    class SlowStepper(CountingStepper):
        def step(self, states: list[CountState]) -> None:
            time.sleep(0.02)
            super().step(states)

    batcher = StepBatcher(SlowStepper(), max_batch_size=4, result=result)
    try:
        time.sleep(0.1)  # idle: not busy
        assert batcher.stats.busy_s == 0.0
        assert batcher.submit(CountJob("a", 5)).result(timeout=10) == ("a", 5)
        assert batcher.stats.busy_s >= 5 * 0.02
    finally:
        batcher.close()
