"""What this process's channel has moved, for a stage's ``stats()`` and so for ``/metrics``.

Why: ``auto`` decides per payload (by size, by locality, by room left in shared memory), so a
pipeline config does not say which backend an edge ends up using. A cluster that turns out to
span hosts, or a ``/dev/shm`` too small for the traffic, shows only as slower requests. Counting
on the consumer's side, where every payload is read (``take``), says which backend each stage's
payloads came by, how many bytes, and how long reading them took; the producer's side says how
many payloads found its shared memory full and went through the object store instead.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Taken:
    """Payloads one backend brought this process."""

    payloads: int = 0
    bytes: int = 0
    seconds: float = 0.0  # in ``take``: read and free
    failed: int = 0  # refs that could not be read (freed, their producer gone, ...)


class ChannelStats:
    """Counters since the process started; a lock because ``take`` also runs on vLLM's
    threads (KV blocks a connector loads)."""

    def __init__(self) -> None:
        self.taken: dict[str, Taken] = {}
        self.overflowed = 0
        self._lock = threading.Lock()

    def record_take(self, backend: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            taken = self.taken.setdefault(backend, Taken())
            taken.payloads += 1
            taken.bytes += nbytes
            taken.seconds += seconds

    def record_failed_take(self, backend: str) -> None:
        with self._lock:
            self.taken.setdefault(backend, Taken()).failed += 1

    def record_overflow(self) -> None:
        with self._lock:
            self.overflowed += 1

    def as_dict(self) -> dict[str, Any]:
        """``{"taken": {backend: {payloads, bytes, seconds, failed}}, "overflowed": n}``, plain
        values, for a stage's ``stats()``."""
        with self._lock:
            taken = {backend: asdict(t) for backend, t in self.taken.items()}
            return {"taken": taken, "overflowed": self.overflowed}


def merged(*reports: dict[str, Any] | None) -> dict[str, Any]:
    """One report of several processes' ``channel_stats()`` (a replica and its engine's
    worker): counts and pool bytes added up."""
    taken: dict[str, dict[str, float]] = {}
    total: dict[str, Any] = {"taken": taken, "overflowed": 0, "pool_bytes": 0}
    for report in filter(None, reports):
        for backend, fields in report["taken"].items():
            into = taken.setdefault(backend, dict.fromkeys(fields, 0))
            for field, value in fields.items():
                into[field] += value
        total["overflowed"] += report["overflowed"]
        total["pool_bytes"] += report.get("pool_bytes", 0)
    return total


counts = ChannelStats()
