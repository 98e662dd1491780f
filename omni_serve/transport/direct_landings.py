"""Where the direct backend's reads land (consumer side): registered memory, pooled.

Fresh pages cost more than the copy (the kernel faults and zeroes them: 16 MB read in 8.4 ms
into new memory, 2 ms into touched memory), so host landings are reused: the tensors a read
returns view one, and it comes back when the last of them dies. The pool stays within its
budget by deregistering idle landings, longest idle first, when a new size needs room; a read
that still does not fit gets memory registered for that one read. GPU reads land in fresh
memory (the CUDA caching allocator already reuses it), registered for the one read.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

MIN_BUFFER = 1 << 20

Landing = tuple[mmap.mmap, Any]  # memory, its registration


def pooled_size(nbytes: int) -> int:
    """The size of a pooled buffer for ``nbytes``: a power of two, so a payload that grows a
    little still fits the buffer it had."""
    return max(MIN_BUFFER, 1 << (nbytes - 1).bit_length())


def _drain(landings: deque[Landing]) -> list[Landing]:
    """Everything in ``landings``, taken out. Reads run in worker threads and finalizers
    append at any time: popleft and append are atomic; iterating the deque while it changes
    is not."""
    taken = []
    with contextlib.suppress(IndexError):
        while True:
            taken.append(landings.popleft())
    return taken


class Landings:
    """``agent`` registers the memory (under ``lock``: NIXL agents are not thread-safe in the
    mode the backend uses); ``budget``: bytes of pooled host landings at most."""

    def __init__(self, agent: Any, lock: threading.RLock, budget: int) -> None:
        self.agent, self.lock, self.budget = agent, lock, budget
        self.idle: deque[Landing] = deque()  # appended to by finalizers too
        self.picking = threading.Lock()
        self.pooled_bytes = 0

    def take(self, nbytes: int, device: torch.device) -> tuple[torch.Tensor, Callable[[], None]]:
        """Memory for one read, and what to call once the transfer is over."""
        if device.type == "cpu":
            landing = self._idle_fitting(nbytes) or self._new(nbytes)
            if landing is not None:
                array = np.frombuffer(landing[0], dtype=np.uint8, count=nbytes)
                weakref.finalize(array, self.idle.append, landing)  # no lock: GC may run it
                return torch.from_numpy(array), lambda: None
        memory = torch.empty(nbytes, dtype=torch.uint8, device=device)
        with self.lock:
            registration = self.agent.register_memory([memory])

        def deregister() -> None:
            with self.lock:
                self.agent.deregister_memory(registration)

        return memory, deregister

    def _idle_fitting(self, nbytes: int) -> Landing | None:
        with self.picking:
            idle = _drain(self.idle)
            fitting = [landing for landing in idle if len(landing[0]) >= nbytes]
            chosen = min(fitting, key=lambda landing: len(landing[0])) if fitting else None
            self.idle.extend(landing for landing in idle if landing is not chosen)
            return chosen

    def _new(self, nbytes: int) -> Landing | None:
        size = pooled_size(nbytes)
        with self.picking:
            if self.pooled_bytes + size > self.budget:
                self._evict(self.pooled_bytes + size - self.budget)
            if self.pooled_bytes + size > self.budget:
                return None  # over budget: a one-read buffer instead
            self.pooled_bytes += size
        memory = mmap.mmap(-1, size)
        with self.lock:
            registration = self.agent.register_memory([torch.frombuffer(memory, dtype=torch.uint8)])
        return memory, registration

    def _evict(self, room: int) -> None:
        """Deregister idle landings, longest idle first, until ``room`` bytes of the budget
        are free (caller holds ``self.picking``); their memory goes once nothing views it."""
        for landing in _drain(self.idle):
            if room <= 0:
                self.idle.append(landing)
                continue
            with self.lock:
                self.agent.deregister_memory(landing[1])
            self.pooled_bytes -= len(landing[0])
            room -= len(landing[0])
