"""The host tier: kept prefixes in this process's memory, least recently used first, bounded
in bytes; what it pushes out goes to the tier below (``TieredPrefixStore``).

Prefixes that begin alike share their blocks (``BlockPool``): the budget counts each block
once, so a hundred callers of one voice agent hold its system prompt's KV once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from omni_serve.kv_store.block_pool import BlockPool
from omni_serve.kv_store.kept_prefix import KeptPrefix, PrefixFacts


@dataclass
class _Held:
    facts: PrefixFacts
    keys: list[str]  # its blocks in the pool
    companion: torch.Tensor | None
    prefix_bytes: int  # its blocks and rows, as if it held them alone
    used_at: float

    @property
    def own_bytes(self) -> int:
        c = self.companion
        return c.numel() * c.element_size() if c is not None else 0


class HostTier:
    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s  # idle this long: pushed down (to disk, or freed without one)
        self.evictions = 0
        self.blocks = BlockPool()
        self._rows_bytes = 0  # the companion rows held (never shared)
        self._held: OrderedDict[str, _Held] = OrderedDict()

    @property
    def nbytes(self) -> int:
        """Memory held: each shared block once."""
        return self.blocks.nbytes + self._rows_bytes

    @property
    def prefix_bytes(self) -> int:
        """What the prefixes held would take without sharing."""
        return sum(held.prefix_bytes for held in self._held.values())

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def held(self) -> list[tuple[str, KeptPrefix]]:
        """Every prefix held, least recently used first (fresh copies of their blocks)."""
        return [(entry_id, self._prefix(held)) for entry_id, held in self._held.items()]

    def get(self, entry_id: str) -> KeptPrefix | None:
        """The prefix, its blocks gathered into a fresh copy; None when not held."""
        held = self._held.get(entry_id)
        if held is None:
            return None
        held.used_at = time.monotonic()
        self._held.move_to_end(entry_id)
        return self._prefix(held)

    def put(self, entry_id: str, kept: KeptPrefix, keys: list[str]) -> list[tuple[str, KeptPrefix]]:
        """Holds ``kept`` (``keys``: one per block, ``engine_block_keys``) unless what it adds
        alone is over the budget, and returns what it pushed out, oldest first (``kept``
        itself among them when it could not stay)."""
        self.remove(entry_id)
        blocks = {len(t) for t in kept.kv.values()}
        if not keys:
            return [(entry_id, kept)]
        if blocks != {len(keys)}:
            raise ValueError(f"{len(keys)} block keys for blocks of {sorted(blocks)}")
        held = _Held(kept.facts, keys, kept.companion, kept.nbytes, time.monotonic())
        if self.blocks.new_bytes(keys, kept.kv) + held.own_bytes > self.max_bytes:
            return [(entry_id, kept)]
        self.blocks.hold(keys, kept.kv)
        self._rows_bytes += held.own_bytes
        self._held[entry_id] = held
        return self.expire()

    def remove(self, entry_id: str) -> bool:
        held = self._held.pop(entry_id, None)
        if held is None:
            return False
        self.blocks.release(held.keys)
        self._rows_bytes -= held.own_bytes
        return True

    def expire(self) -> list[tuple[str, KeptPrefix]]:
        """Pushes out the least recently used while over the budget, and the idle ones."""
        out = []
        now = time.monotonic()
        while self._held:
            entry_id, held = next(iter(self._held.items()))
            if self.nbytes <= self.max_bytes and now - held.used_at <= self.ttl_s:
                break
            out.append((entry_id, self._prefix(held)))
            self.remove(entry_id)
            self.evictions += 1
        return out

    def _prefix(self, held: _Held) -> KeptPrefix:
        return KeptPrefix(held.facts, self.blocks.gather(held.keys), held.companion)
