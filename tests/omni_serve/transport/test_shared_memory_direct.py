"""The shared_memory_direct backend: one put, mapped zero-copy by a reader on the producer's
host, read over NIXL by one on another host (here a peer process that reports another
hostname; the real two-host run is in tests/integration/test_two_hosts.py)."""

from __future__ import annotations

import gc
import os
import socket
import time

import pytest
import torch

from omni_serve.transport import (
    ChannelError,
    ChannelFull,
    SharedMemoryDirectChannel,
    direct_endpoint,
    hosts,
    shared_memory,
    shm_pool,
    take,
)
from tests.omni_serve.transport.peer import (
    Peer,
    assert_same_payload,
    channel_ops,
    mixed_payload,
    serve_ops,
)

pytest.importorskip("omni_serve.compat.nixl").load_nixl()
ELSEWHERE = "omni-host-elsewhere"


def _peer_main(conn, env: dict[str, str]) -> None:
    """A stage in another process; with HOSTNAME_AS, on another host as far as it can tell."""
    if host := env.get("HOSTNAME_AS"):
        socket.gethostname = lambda: host
        hosts.host_id.cache_clear()
    serve_ops(conn, channel_ops(SharedMemoryDirectChannel()))


@pytest.fixture(scope="module")
def elsewhere():
    peer = Peer(_peer_main, HOSTNAME_AS=ELSEWHERE)
    yield peer
    peer.close()


def _state(ref) -> int:
    """The state of ``ref``'s segment in this (the producer's) process, if it is ``ref``'s."""
    view, _ = shared_memory.producer_segment(ref.key)
    generation, state, _ = shared_memory.HEADER.unpack_from(view, 0)
    return state if generation == ref.handle[0][1] else shared_memory.FREE


def _wait_state(ref, state: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (now := _state(ref)) != state and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


async def test_a_reader_on_another_host_reads_over_nixl_and_hands_the_segment_back(elsewhere):
    channel = SharedMemoryDirectChannel()
    ref = channel.put(mixed_payload(256))
    assert ref.backend == "shared_memory_direct"
    # Its host cannot map this /dev/shm: NIXL or nothing.
    assert_same_payload(elsewhere("take", ref), mixed_payload(256))
    assert _wait_state(ref, shared_memory.FREE) == shared_memory.FREE, "the free never came"
    registered = direct_endpoint.endpoint().registered
    again = channel.put(mixed_payload(256, 2.0))
    assert again.key == ref.key and direct_endpoint.endpoint().registered == registered
    # The reused segment, lent once.
    assert_same_payload(elsewhere("take", again), mixed_payload(256, 2.0))


async def test_a_reader_on_this_host_maps_the_segment_instead():
    """READ is the state only a mapping reader sets: a read over NIXL leaves it in use."""
    channel = SharedMemoryDirectChannel()
    ref = channel.put(mixed_payload(256))
    got = await channel.get(ref)
    assert _state(ref) == shared_memory.READ
    assert_same_payload(got, mixed_payload(256))
    channel.free(ref)
    assert _state(ref) == shared_memory.READ  # its tensors still view the segment
    del got
    gc.collect()
    assert _wait_state(ref, shared_memory.FREE) == shared_memory.FREE


async def test_abandon_from_another_host_frees_only_a_payload_no_one_read(elsewhere):
    channel = SharedMemoryDirectChannel()
    unread, read = channel.put(mixed_payload(256)), channel.put(mixed_payload(256, 3.0))
    got = await channel.get(read)  # a consumer on this host has it mapped
    elsewhere("abandon", read)  # the caller's call ended: its ref goes back...
    elsewhere("abandon", unread)
    assert _wait_state(unread, shared_memory.FREE) == shared_memory.FREE
    assert _state(read) == shared_memory.READ  # ...unless a consumer holds it
    assert_same_payload(got, mixed_payload(256, 3.0))
    channel.free(read)
    del got
    gc.collect()
    assert _wait_state(read, shared_memory.FREE) == shared_memory.FREE


async def test_a_segment_the_pool_unlinks_is_no_longer_lent(elsewhere, monkeypatch):
    """Its registration goes before the mapping: a stale ref fails, never reads whatever is
    mapped at that address next (the generation count spans all of a process's segments)."""
    channel = SharedMemoryDirectChannel()
    old = channel.put(torch.zeros(1 << 16))
    await take(old)  # free, so the pool may evict it
    owner = direct_endpoint.endpoint()
    index = old.handle[1].buffer
    assert index in owner.lent
    pool = shared_memory._pool.segments.values()
    in_use = sum(s.size for s in pool if s.state()[1] != shared_memory.FREE)
    largest = max(s.size for s in pool)  # earlier tests' segments may still be pooled
    monkeypatch.setattr(shm_pool, "POOL_BYTES", in_use + 2 * largest)
    # A size no pooled segment has (2 * largest), in a budget with room for nothing else:
    # every free segment is evicted.
    bigger = channel.put(torch.ones(largest // 4 + 1024))
    assert index not in owner.lent and not (shared_memory.SHM_DIR / old.key).exists()
    await take(bigger)
    newer = channel.put(torch.ones(1 << 16))
    with pytest.raises(ChannelError):
        elsewhere("get", old)
    assert torch.equal(elsewhere("take", newer), torch.ones(1 << 16))


def test_a_payload_the_pool_cannot_take_is_refused_not_given_a_one_shot_segment(monkeypatch):
    """Registering a one-shot segment for one read would cost more than the object store,
    where ``auto`` sends what raises ``ChannelFull``."""
    monkeypatch.setattr(shm_pool, "POOL_BYTES", 1 << 20)
    ours = f"{shared_memory.PREFIX}{os.getpid()}-*"  # other test processes make their own
    before = set(shared_memory.SHM_DIR.glob(ours))
    with pytest.raises(ChannelFull, match="OMNI_SHM_POOL_BYTES"):
        SharedMemoryDirectChannel().put(torch.ones(4 << 20, dtype=torch.uint8))
    assert set(shared_memory.SHM_DIR.glob(ours)) <= before


async def test_a_reservation_written_in_place_is_read_on_another_host(elsewhere):
    channel = SharedMemoryDirectChannel()
    reservation = channel.reserve(torch.empty(64, 32, device="meta"))
    reservation.tensors.copy_(torch.arange(64 * 32.0).view(64, 32))
    ref = reservation.commit()
    assert ref.backend == "shared_memory_direct"
    assert torch.equal(elsewhere("take", ref), torch.arange(64 * 32.0).view(64, 32))


@pytest.mark.parametrize("payload", [{}, {"none": torch.empty(0, 64)}], ids=["no_tensors", "empty"])
async def test_an_empty_payload_is_read_on_another_host(elsewhere, payload):
    """Its read still covers the header, which the generation check needs."""
    got = elsewhere("take", SharedMemoryDirectChannel().put(payload))
    assert {key: t.shape for key, t in got.items()} == {k: t.shape for k, t in payload.items()}


async def test_the_owner_loop_keeps_its_busy_pace_only_while_a_payload_is_unread():
    """A reader over TCP moves only as the owner's loop polls (1 ms while busy); a consumer
    here that has mapped the payload (a Talker holding its prompt rows all request long,
    say) needs nothing of it."""
    channel = SharedMemoryDirectChannel()
    ref = channel.put(torch.ones(1 << 16))
    lent = direct_endpoint.endpoint().lent[ref.handle[1].buffer]
    assert lent.in_use()
    got = await channel.get(ref)
    assert not lent.in_use()
    channel.free(ref)
    del got
