"""The item cache keeps the most recently used rows within its bytes, and ``encode_with_cache``
asks the tower only for the items it does not hold, in one call."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.encoders.item_cache import EncodedItemCache, encode_with_cache


def rows(n: int, value: float = 0.0) -> torch.Tensor:
    return torch.full((n, 4), value)  # 16 bytes a row


def test_least_recently_used_rows_leave_first_within_the_bytes():
    cache = EncodedItemCache(max_bytes=3 * 16)
    cache.put("a", rows(1))
    cache.put("b", rows(1))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", rows(2))  # 4 rows > 3: b goes, not a
    assert cache.get("b") is None and cache.get("a") is not None
    assert cache.stats() == {"hits": 2, "misses": 1, "items": 2, "bytes": 48}


def test_an_item_larger_than_the_cache_is_not_kept_and_evicts_nothing():
    cache = EncodedItemCache(max_bytes=32)
    cache.put("a", rows(1))
    cache.put("huge", rows(3))
    assert cache.get("huge") is None and cache.get("a") is not None


def test_putting_a_key_again_replaces_its_rows_and_their_bytes():
    cache = EncodedItemCache(max_bytes=64)
    cache.put("a", rows(1))
    cache.put("a", rows(2, 1.0))
    assert cache.stats()["bytes"] == 32 and cache.get("a")[0, 0] == 1.0


def test_only_missing_items_are_encoded_in_one_call_and_come_back_in_order():
    cache = EncodedItemCache(max_bytes=1 << 20)
    cache.put("b", rows(1, 2.0))
    asked: list[list[int]] = []

    def encode(which: list[int]) -> list[torch.Tensor]:
        asked.append(which)
        return [rows(1, float(i) * 10) for i in which]

    found = encode_with_cache(cache, ["a", "b", "c"], encode)
    assert asked == [[0, 2]]
    assert [float(r[0, 0]) for r in found] == [0.0, 2.0, 20.0]
    assert encode_with_cache(cache, ["c", "a"], encode) == [found[2], found[0]]
    assert asked == [[0, 2]]  # all found: the tower was not asked again


def test_a_tower_answering_for_the_wrong_number_of_items_is_an_error():
    with pytest.raises(ValueError, match="encoded 1 items for 2 asked"):
        encode_with_cache(EncodedItemCache(1 << 20), ["a", "b"], lambda which: [rows(1)])


def test_a_zero_byte_cache_keeps_nothing():
    cache = EncodedItemCache(max_bytes=0)
    calls = []
    encode_with_cache(cache, ["a"], lambda which: calls.append(which) or [rows(1)])
    encode_with_cache(cache, ["a"], lambda which: calls.append(which) or [rows(1)])
    assert calls == [[0], [0]] and cache.stats()["items"] == 0
