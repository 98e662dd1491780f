"""The host tier: kept prefixes in this process's memory, least recently used first, bounded
in bytes; what it pushes out goes to the tier below (``TieredPrefixStore``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from omni_serve.kv_store.kept_prefix import KeptPrefix


@dataclass
class _Held:
    kept: KeptPrefix
    nbytes: int
    used_at: float


class HostTier:
    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s  # idle this long: pushed down (to disk, or freed without one)
        self.nbytes = 0
        self.evictions = 0
        self._held: OrderedDict[str, _Held] = OrderedDict()

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def held(self) -> list[tuple[str, KeptPrefix]]:
        """Every prefix held, least recently used first."""
        return [(entry_id, held.kept) for entry_id, held in self._held.items()]

    def get(self, entry_id: str) -> KeptPrefix | None:
        held = self._held.get(entry_id)
        if held is None:
            return None
        held.used_at = time.monotonic()
        self._held.move_to_end(entry_id)
        return held.kept

    def put(self, entry_id: str, kept: KeptPrefix) -> list[tuple[str, KeptPrefix]]:
        """Holds ``kept`` (unless it alone is over the budget) and returns what it pushed
        out, oldest first (``kept`` itself among them when it could not stay)."""
        self.remove(entry_id)
        nbytes = kept.nbytes
        if nbytes > self.max_bytes:
            return [(entry_id, kept)]
        self._held[entry_id] = _Held(kept, nbytes, time.monotonic())
        self.nbytes += nbytes
        return self.expire()

    def remove(self, entry_id: str) -> KeptPrefix | None:
        held = self._held.pop(entry_id, None)
        if held is None:
            return None
        self.nbytes -= held.nbytes
        return held.kept

    def expire(self) -> list[tuple[str, KeptPrefix]]:
        """Pushes out the least recently used while over the budget, and the idle ones."""
        out = []
        now = time.monotonic()
        while self._held:
            entry_id, held = next(iter(self._held.items()))
            if self.nbytes <= self.max_bytes and now - held.used_at <= self.ttl_s:
                break
            self.remove(entry_id)
            self.evictions += 1
            out.append((entry_id, held.kept))
        return out
