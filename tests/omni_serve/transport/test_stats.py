"""Channel counters: which backend a process's payloads came by, and how much shared memory it
holds, as a stage's ``stats()`` reports them to /metrics."""

from __future__ import annotations

import pytest
import torch

from omni_serve.transport import (
    ChannelError,
    InlineChannel,
    SharedMemoryChannel,
    channel_stats,
    shm_pool,
    take,
)
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.stats import ChannelStats, merged


def _taken(backend: str) -> dict[str, float]:
    return channel_stats()["taken"].get(backend, {"payloads": 0, "bytes": 0, "failed": 0})


async def test_every_take_counts_under_the_backend_its_payload_came_by():
    inline, shared = _taken("inline"), _taken("shared_memory")
    small, large = torch.zeros(16), torch.zeros(1 << 18)  # 64 B inline, 1 MiB in a segment
    await take(InlineChannel().put(small))
    await take(SharedMemoryChannel().put(large))
    await take(SharedMemoryChannel().put({"a": large, "b": small}))
    now_inline, now_shared = _taken("inline"), _taken("shared_memory")
    assert now_inline["payloads"] - inline["payloads"] == 1
    assert now_inline["bytes"] - inline["bytes"] == 64
    assert now_shared["payloads"] - shared["payloads"] == 2
    assert now_shared["bytes"] - shared["bytes"] == 2 * (1 << 20) + 64
    assert now_shared["seconds"] > shared.get("seconds", 0.0)


async def test_a_ref_that_cannot_be_read_counts_as_failed_not_taken():
    channel = SharedMemoryChannel()
    ref = channel.put(torch.ones(1 << 16))
    channel.free(ref)
    before = _taken("shared_memory")
    with pytest.raises(ChannelError, match="freed"):
        await take(ref)
    after = _taken("shared_memory")
    assert (after["failed"] - before["failed"], after["payloads"]) == (1, before["payloads"])


def test_pool_bytes_are_the_segments_this_process_holds(monkeypatch):
    monkeypatch.setattr(shm, "_pool", shm_pool.SegmentPool())
    assert channel_stats()["pool_bytes"] == 0
    try:
        ref = SharedMemoryChannel().put(torch.zeros(3 << 18))  # 3 MiB: a 4 MiB segment
        assert channel_stats()["pool_bytes"] == 4 << 20
        SharedMemoryChannel().free(ref)
        assert channel_stats()["pool_bytes"] == 4 << 20  # free, pooled for the next payload
    finally:
        shm._pool.close()


def test_counts_are_plain_values_a_handle_call_can_return():
    counts = ChannelStats()
    counts.record_take("object_store", 10, 0.5)
    counts.record_take("object_store", 6, 0.25)
    counts.record_failed_take("direct")
    counts.record_overflow()
    assert counts.as_dict() == {
        "taken": {
            "object_store": {"payloads": 2, "bytes": 16, "seconds": 0.75, "failed": 0},
            "direct": {"payloads": 0, "bytes": 0, "seconds": 0.0, "failed": 1},
        },
        "overflowed": 1,
    }


def test_a_replicas_and_its_engines_counts_add_up():
    """The Thinker reports its own takes and those of vLLM's worker (KV blocks) as one."""
    replica = {
        "taken": {"inline": {"payloads": 2, "bytes": 8, "seconds": 0.5, "failed": 0}},
        "overflowed": 0,
        "pool_bytes": 4,
    }
    engine = {
        "taken": {
            "inline": {"payloads": 1, "bytes": 2, "seconds": 0.25, "failed": 1},
            "shared_memory": {"payloads": 3, "bytes": 9, "seconds": 1.0, "failed": 0},
        },
        "overflowed": 1,
        "pool_bytes": 16,
    }
    assert merged(replica, engine, None) == {
        "taken": {
            "inline": {"payloads": 3, "bytes": 10, "seconds": 0.75, "failed": 1},
            "shared_memory": {"payloads": 3, "bytes": 9, "seconds": 1.0, "failed": 0},
        },
        "overflowed": 1,
        "pool_bytes": 20,
    }
    assert merged(replica, None) == replica  # no engine worker to ask
