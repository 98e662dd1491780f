"""The torch AR engine's scheduler: a request aborted while a step runs (a client that left,
a barge-in) keeps its slot until the step's thread is done with it, so the requests batched
with it go on. The runner is a slot table whose decode reads each state's slot on the step
thread, as the Talker's does."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY, StepOutput, TorchAREngine


@dataclass(eq=False)
class State:
    slot: int | None


class SlotRunner:
    max_batch_size = 4

    def __init__(self) -> None:
        self.free = [0, 1, 2, 3]
        # ``paused`` holds decode steps; ``entered`` counts them in. Both under one lock: a step
        # that enters after ``pause`` is sure to wait (two events let one slip past).
        self.lock = threading.Condition()
        self.paused = False
        self.entered = 0

    def pause(self) -> int:
        with self.lock:
            self.paused = True
            return self.entered

    def wait_for_step_after(self, entered: int) -> None:
        with self.lock:
            self.lock.wait_for(lambda: self.entered > entered, timeout=5)

    def resume(self) -> None:
        with self.lock:
            self.paused = False
            self.lock.notify_all()

    def new_state(self, request):
        return State(self.free.pop(0))

    def can_admit(self):
        return True

    def feed(self, state, item):
        pass

    def ready(self, state):
        return True

    def prefill(self, state):
        return StepOutput(token=1)

    def decode(self, states, last_tokens):
        with self.lock:
            self.entered += 1
            self.lock.notify_all()
            self.lock.wait_for(lambda: not self.paused, timeout=5)
        return [StepOutput(token=10 + s.slot) for s in states]  # a freed slot: TypeError

    def release(self, state):
        self.free.append(state.slot)
        state.slot = None

    def suppress_tokens(self, state):
        return None


async def test_an_abort_during_a_step_frees_the_slot_after_it_and_the_batch_goes_on():
    runner = SlotRunner()
    engine = TorchAREngine(runner)
    await engine.start()
    streams = [
        engine.generate(ARRequest(r, [1], sampling=SamplingConfig(max_tokens=6)))
        for r in ("a", "b")
    ]
    firsts = [await anext(s) for s in streams]  # both prefilled
    assert all(f is not None for f in firsts)
    entered = runner.pause()
    await asyncio.to_thread(runner.wait_for_step_after, entered)
    await engine.abort("a")  # while the step thread reads a's slot
    assert 0 not in runner.free  # not yet: the step still reads it
    runner.resume()
    rest = [chunk async for chunk in streams[1]]
    assert rest and runner.free.count(0) == 1  # freed once the step was done
    # a ended without an error, after at most the tokens of the steps it finished before
    leftover = [chunk async for chunk in streams[0]]
    assert len(leftover) <= entered and all(c.token_ids == [10] for c in leftover)
    await engine.shutdown()


class FixedLogitsRunner(SlotRunner):
    """Every step offers the same logits: token 3 just ahead of token 5."""

    def prefill(self, state):
        return StepOutput(logits=torch.tensor([0.0, 0.0, 0.0, 2.0, 0.0, 1.96]))

    def decode(self, states, last_tokens):
        return [self.prefill(s) for s in states]


async def test_a_penalty_history_counts_as_seen_before_the_first_token():
    """transformers penalises its input ids too (a Talker prompt's codec ids): with token 3 in
    the request's history, a 1.05 penalty puts 5 ahead from the first token on."""
    sampling = SamplingConfig(max_tokens=1, repetition_penalty=1.05)
    engine = TorchAREngine(FixedLogitsRunner())
    await engine.start()
    plain = ARRequest("plain", [1], sampling=sampling)
    told = ARRequest("told", [1], sampling=sampling, extra={PENALTY_HISTORY: [3]})
    tokens = [[t async for c in engine.generate(r) for t in c.token_ids] for r in (plain, told)]
    await engine.shutdown()
    assert tokens == [[3], [5]]
