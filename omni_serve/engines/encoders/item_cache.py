"""Rows an encoder already computed, per media item, so a conversation's media encode once.

A chat resends its earlier turns' media with every turn (a voice chat's clips, the image or
video it talks about), so without this an encoder stage encodes turn N's N clips all again.
Items, not requests, are the unit: turn N+1 carries turn N's items plus new ones. A tower
gives an item the same rows whether it is encoded alone or beside others (each item attends
only within itself; bit for bit on CPU, tests/omni_serve/models/qwen3_omni/
test_encoder_items.py), so cached rows stand for freshly computed ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch


class EncodedItemCache:
    """Least recently used rows out first, within ``max_bytes`` (0: nothing is kept). Safe
    across threads: an encoder stage runs its towers on worker threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> torch.Tensor | None:
        with self._lock:
            rows = self._rows.get(key)
            if rows is None:
                self.misses += 1
                return None
            self._rows.move_to_end(key)
            self.hits += 1
            return rows

    def put(self, key: str, rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._rows.pop(key, None)
            if old is not None:
                self._bytes -= old.numel() * old.element_size()
            self._rows[key] = rows
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._rows.popitem(last=False)
                self._bytes -= evicted.numel() * evicted.element_size()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "items": len(self._rows),
                "bytes": self._bytes,
            }


def encode_with_cache(
    cache: EncodedItemCache,
    keys: Sequence[str],
    encode: Callable[[list[int]], list[torch.Tensor]],
) -> list[torch.Tensor]:
    """Each item's rows, in order: from ``cache`` where it has them, the rest from one call
    ``encode(indices of the missing items)`` (their rows, in that order), then kept."""
    found = [cache.get(key) for key in keys]
    missing = [i for i, rows in enumerate(found) if rows is None]
    if missing:
        fresh = encode(missing)
        if len(fresh) != len(missing):
            raise ValueError(f"encoded {len(fresh)} items for {len(missing)} asked")
        for i, rows in zip(missing, fresh, strict=True):
            cache.put(keys[i], rows)
            found[i] = rows
    return found  # type: ignore[return-value]
