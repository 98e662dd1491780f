"""The torch AR engine's scheduler: a request aborted while a step runs (a client that left,
a barge-in) keeps its slot until the step's thread is done with it, so the requests batched
with it go on. The runner is a slot table whose decode reads each state's slot on the step
thread, as the Talker's does."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import StepOutput, TorchAREngine


@dataclass(eq=False)
class State:
    slot: int | None


class SlotRunner:
    max_batch_size = 4

    def __init__(self) -> None:
        self.free = [0, 1, 2, 3]
        self.in_decode = threading.Event()
        self.resume = threading.Event()
        self.resume.set()

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
        self.in_decode.set()
        self.resume.wait(5)
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
    runner.resume.clear()
    await asyncio.to_thread(runner.in_decode.wait, 5)
    await engine.abort("a")  # while the step thread reads a's slot
    assert 0 not in runner.free  # not yet: the step still reads it
    runner.resume.set()
    rest = [chunk async for chunk in streams[1]]
    assert rest and runner.free.count(0) == 1  # freed once the step was done
    assert [chunk async for chunk in streams[0]] == []  # a ended, without an error
    await engine.shutdown()
