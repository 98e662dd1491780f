"""The direct (NIXL) backend between processes: what the in-process contract suite cannot show."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from omni_serve.transport import (
    ChannelError,
    DirectChannel,
    direct_endpoint,
    take,
)
from tests.omni_serve.transport.peer import (
    Peer,
    assert_same_payload,
    buffers_in_use,
    channel_ops,
    mixed_payload,
    serve_ops,
)

pytest.importorskip("omni_serve.compat.nixl").load_nixl()


def _peer_main(conn, env: dict[str, str]) -> None:
    """A stage in another process: puts, takes, abandons and reports its buffers on request."""
    channel = DirectChannel()
    serve_ops(
        conn,
        {
            **channel_ops(channel),
            "in_use": buffers_in_use,
            "pause": _pause_owner_loop,
            "resume": _resume_owner_loop,
        },
    )


def _pause_owner_loop(_=None) -> None:
    """Stop this process's owner loop: nothing here progresses UCX until it resumes."""
    owner = direct_endpoint.endpoint()
    owner.stopping = True
    owner.wake.set()
    owner.thread.join(5)


def _resume_owner_loop(_=None) -> None:
    owner = direct_endpoint.endpoint()
    owner.stopping, owner.thread = False, None
    owner._serve()


@pytest.fixture
def peer():
    peer = Peer(_peer_main)
    yield peer
    peer.close()


async def test_a_payload_from_another_process_is_read_and_its_buffer_handed_back(peer):
    ref = peer("put", mixed_payload())
    assert ref.backend == "direct" and peer("in_use") == 1
    assert_same_payload(await take(ref), mixed_payload())
    assert peer.wait_in_use(0) == 0  # the free notification reached the owner
    again = peer("put", mixed_payload())
    assert again.handle.buffer == ref.handle.buffer  # reused, not registered anew


async def test_a_payload_from_here_is_read_by_another_process_and_handed_back(peer):
    channel = DirectChannel()
    ref = channel.put(mixed_payload())
    assert_same_payload(peer("take", ref), mixed_payload())
    owner = direct_endpoint.endpoint()
    deadline = time.monotonic() + 3
    while owner.buffers[ref.handle.buffer].state != direct_endpoint.FREE:
        assert time.monotonic() < deadline, "the consumer's free never arrived"
        await asyncio.sleep(0.02)


async def test_concurrent_reads_land_in_separate_buffers(peer):
    """Reads run in worker threads; each must get a landing buffer of its own."""
    refs = [peer("put", torch.full((1 << 18,), float(i))) for i in range(8)]
    got = await asyncio.gather(*(take(ref) for ref in refs))
    for i, tensor in enumerate(got):
        assert torch.equal(tensor, torch.full((1 << 18,), float(i))), i
    assert peer.wait_in_use(0) == 0


async def test_a_stale_ref_reads_as_freed_never_as_the_next_payload(peer):
    ref = peer("put", torch.zeros(1 << 18))
    await take(ref)
    peer.wait_in_use(0)
    with pytest.raises(ChannelError, match="freed"):
        await DirectChannel().get(ref)  # remembered here as freed
    newer = peer("put", torch.ones(1 << 18))
    assert newer.handle.buffer == ref.handle.buffer
    other = Peer(_peer_main)  # a reader that never saw the first ref: the generation check stops it
    try:
        with pytest.raises(ChannelError, match="freed"):
            other("get", ref)
        assert torch.equal(other("take", newer), torch.ones(1 << 18))
    finally:
        other.close()


async def test_a_stray_notification_does_not_stop_the_owner_freeing(peer):
    ref = peer("put", torch.ones(1 << 18))
    here = direct_endpoint.endpoint()
    with here.lock:
        here._load(ref.handle)
        here.agent.send_notif(ref.handle.agent, b"not:a-number:x")
        here.agent.send_notif(ref.handle.agent, b"hello")
    await take(ref)
    assert peer.wait_in_use(0) == 0


async def test_reads_after_a_free_do_not_wait_for_the_owner_loop(peer, monkeypatch):
    """A free notification still in flight used to hold this agent's next read until the
    owner's loop polled (1 ms each read); with that loop stopped, the read never finished."""
    await take(peer("put", torch.ones(1 << 10)))  # connected (its first read needs the owner)
    refs = [peer("put", torch.full((1 << 10,), float(i))) for i in range(3)]
    peer("pause")
    monkeypatch.setattr(direct_endpoint, "TRANSFER_TIMEOUT_S", 3.0)
    for i, ref in enumerate(refs):  # each take frees its ref before the next read
        assert torch.equal(await take(ref), torch.full((1 << 10,), float(i)))
    peer("resume")
    assert peer.wait_in_use(0) == 0  # and the frees all reached the owner


async def test_abandon_by_the_caller_frees_an_unread_payload(peer):
    ref = peer("put", torch.ones(1 << 18))
    DirectChannel().abandon(ref)  # this process only carried it
    assert peer.wait_in_use(0) == 0


@pytest.mark.parametrize("connected", [False, True], ids=["unknown", "connected"])
async def test_a_dead_producer_fails_the_read_instead_of_hanging(peer, connected):
    if connected:  # this process has read from it before: the connection is cached
        await take(peer("put", torch.ones(1 << 18)))
    ref = peer("put", torch.ones(1 << 18))
    peer.process.kill()
    peer.process.join(10)
    start = time.monotonic()
    with pytest.raises(ChannelError):
        await DirectChannel().get(ref)
    assert time.monotonic() - start < 5


def test_a_buffer_whose_consumer_died_is_reused_after_the_lease(monkeypatch):
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # an agent with no buffers yet
    channel = DirectChannel()
    ref = channel.put(torch.ones(1 << 18))
    assert channel.put(torch.ones(1 << 18)).handle.buffer != ref.handle.buffer
    monkeypatch.setattr(direct_endpoint, "LEASE_S", 0.0)
    time.sleep(0.01)
    assert channel.put(torch.ones(1 << 18)).handle.buffer == ref.handle.buffer


async def test_payloads_beyond_the_pool_budget_get_a_buffer_of_their_own(monkeypatch):
    owner = direct_endpoint.endpoint()
    monkeypatch.setattr(direct_endpoint, "POOL_BYTES", owner.pooled_bytes)
    channel = DirectChannel()
    ref = channel.put(torch.arange(1 << 20))  # no pooled buffer this size is free
    assert not owner.buffers[ref.handle.buffer].pooled
    assert torch.equal(await take(ref), torch.arange(1 << 20))
    assert ref.handle.buffer not in owner.buffers  # deregistered and dropped


async def test_a_new_size_over_the_budget_evicts_free_pooled_buffers_not_used_ones(
    peer, monkeypatch
):
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # an agent with no buffers yet
    monkeypatch.setattr(direct_endpoint, "POOL_BYTES", 6 << 20)
    owner, channel = direct_endpoint.endpoint(), DirectChannel()
    kept = channel.put(torch.zeros(1 << 18))  # a 2 MB buffer (1 MB + header), left in use
    old = channel.put(torch.zeros(1 << 18))  # another 2 MB buffer, read and freed below
    assert torch.equal(peer("take", old), torch.zeros(1 << 18))
    deadline = time.monotonic() + 3
    while owner.buffers[old.handle.buffer].state != direct_endpoint.FREE:
        assert time.monotonic() < deadline, "the reader's free never arrived"
        await asyncio.sleep(0.02)
    grown = channel.put(torch.ones(1 << 19))  # 2 MB + header: a 4 MB buffer, over the budget
    assert old.handle.buffer not in owner.buffers  # the free one made room
    assert owner.buffers[kept.handle.buffer].state == direct_endpoint.IN_USE  # never the used one
    assert owner.buffers[grown.handle.buffer].pooled and owner.pooled_bytes == 6 << 20
    assert grown.handle.dropped == old.handle.dropped + 1
    assert torch.equal(peer("take", grown), torch.ones(1 << 19))  # the reader reloads
    channel.free(kept)


async def test_a_reader_over_its_landing_budget_evicts_idle_landings(peer, monkeypatch):
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # a reader with no landings yet
    monkeypatch.setattr(direct_endpoint, "POOL_BYTES", 4 << 20)
    landings = direct_endpoint.endpoint().landings
    small = await take(peer("put", torch.zeros(1 << 18)))  # lands in a 2 MB landing
    assert torch.equal(small, torch.zeros(1 << 18)) and landings.pooled_bytes == 2 << 20
    del small  # the landing is idle again once the read's worker thread has let go of it
    await _until(lambda: len(landings.idle) == 1)
    grown = await take(peer("put", torch.ones(1 << 19)))  # 2 MB + header: a 4 MB landing
    assert torch.equal(grown, torch.ones(1 << 19))
    assert landings.pooled_bytes == 4 << 20  # the idle 2 MB one made room
    del grown
    await _until(lambda: len(landings.idle) == 1)
    assert [len(memory) for memory, _ in landings.idle] == [4 << 20]


async def _until(condition, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def test_over_tcp_the_owner_drives_the_transfer():
    """UCX_TLS=tcp is the wire between two hosts: the owner's notification loop has to make
    progress for the reader, who would otherwise wait forever."""
    producer, consumer = Peer(_peer_main, UCX_TLS="tcp"), Peer(_peer_main, UCX_TLS="tcp")
    try:
        payload = torch.randn(4 << 20, generator=torch.Generator().manual_seed(1))  # 16 MB
        ref = producer("put", payload)
        assert torch.equal(consumer("take", ref), payload)
        assert producer.wait_in_use(0) == 0
    finally:
        producer.close()
        consumer.close()


def test_the_owner_loop_polls_fast_right_after_a_put_then_at_its_busy_pace(monkeypatch):
    """Readers over TCP move only as fast as the owner progresses UCX, and they come right
    after a put: the loop keeps a fast pace for a while after each put, then slows down."""
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # a fresh owner and loop
    paces = []

    class Recorded(threading.Event):
        def wait(self, timeout=None):
            paces.append(timeout)
            return super().wait(timeout)

    owner = direct_endpoint.endpoint()
    owner.wake = Recorded()
    ref = DirectChannel().put(torch.ones(1 << 10))
    time.sleep(0.05)
    assert direct_endpoint.POLL_FAST_S in paces
    monkeypatch.setattr(direct_endpoint, "FAST_S", 0.0)  # "a while" is over
    paces.clear()
    time.sleep(0.05)
    assert paces and set(paces) == {direct_endpoint.POLL_BUSY_S}  # the payload is still out
    owner._stop()
    DirectChannel().free(ref)


async def test_a_reservation_written_in_place_is_read_by_another_process(peer, monkeypatch):
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # an agent with no buffers yet
    channel = DirectChannel()
    like = {
        k: torch.empty(t.shape, dtype=t.dtype, device="meta") for k, t in mixed_payload().items()
    }
    channel.reserve(like).cancel()
    owner = direct_endpoint.endpoint()
    (cancelled,) = owner.buffers.values()
    assert cancelled.state == direct_endpoint.FREE  # given back at once
    reservation = channel.reserve(like)
    for key, t in mixed_payload().items():
        reservation.tensors[key].copy_(t)
    ref = reservation.commit()
    assert ref.handle.buffer == cancelled.index  # the same buffer, reused
    assert_same_payload(peer("take", ref), mixed_payload())


async def test_a_stale_ref_to_a_dropped_buffer_never_reads_the_next_payload(peer, monkeypatch):
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)  # an agent with no buffers yet
    monkeypatch.setattr(direct_endpoint, "POOL_BYTES", 0)  # every buffer is a one-read buffer
    owner, channel = direct_endpoint.endpoint(), DirectChannel()
    stale = channel.put(torch.zeros(1 << 18))
    assert torch.equal(peer("take", stale), torch.zeros(1 << 18))
    deadline = time.monotonic() + 3
    while stale.handle.buffer in owner.buffers:  # freed by the reader, then dropped
        assert time.monotonic() < deadline, "the reader's free never arrived"
        await asyncio.sleep(0.02)
    fresh = channel.put(torch.ones(1 << 18))
    assert fresh.handle.buffer != stale.handle.buffer
    # The allocator may put the fresh buffer at the stale one's address (it did in CI), where a
    # reader on this host still reads: its header must not show the stale generation.
    assert fresh.handle.generation != stale.handle.generation
    other = Peer(_peer_main)  # a reader that never saw the stale ref
    try:
        with pytest.raises(ChannelError):  # not the fresh payload
            other("get", stale)
        # and the failed read does not cut it off from this (live) producer
        assert torch.equal(other("take", fresh), torch.ones(1 << 18))
    finally:
        other.close()


async def test_after_the_owner_drops_a_buffer_a_reader_reloads_it_once_its_reads_end():
    """A new buffer may sit at a dropped one's address (the CUDA caching allocator hands the
    block back), which NIXL 1.5.1 refuses to re-key for a reader that knew the old one: the
    reader drops the owner's agent and adds it afresh, once its reads from it are over."""
    owner = Peer(_peer_main, OMNI_DIRECT_POOL_BYTES="0")  # every buffer is a one-read buffer
    try:
        first = owner("put", mixed_payload())
        assert_same_payload(await take(first), mixed_payload())  # loads the owner's agent here
        assert owner.wait_in_use(0) == 0  # read, freed and dropped by the owner
        second = owner("put", mixed_payload())
        assert second.handle.dropped == first.handle.dropped + 1
        reader = direct_endpoint.endpoint()
        reloads = reader.reloads
        with reader.lock:
            reader.reading[second.handle.agent] = 1  # another read from it is under way
        taking = asyncio.ensure_future(take(second))
        await asyncio.sleep(0.3)
        assert not taking.done() and reader.reloads == reloads  # waits for that read
        with reader.lock:
            reader.reading[second.handle.agent] = 0
            reader.reads_ended.notify_all()
        assert_same_payload(await asyncio.wait_for(taking, 10), mixed_payload())
        assert reader.reloads == reloads + 1
        third = owner("put", mixed_payload())  # and again: each dropped buffer, one reload
        assert_same_payload(await take(third), mixed_payload())
        assert reader.reloads == reloads + 2 and owner.wait_in_use(0) == 0
    finally:
        owner.close()


async def test_past_max_owners_the_least_recent_is_forgotten_and_loaded_again_when_needed(
    peer, monkeypatch
):
    """Replicas come and go: a consumer keeps at most MAX_OWNERS owners loaded (in its reading
    agent and its notifier), and an owner it forgot is read and freed as before."""
    from omni_serve.transport import direct_notes

    monkeypatch.setattr(direct_endpoint, "MAX_OWNERS", 1)
    monkeypatch.setattr(direct_notes, "MAX_OWNERS", 1)
    monkeypatch.setattr(direct_notes, "QUIET_S", 0.2)
    other = Peer(_peer_main)
    try:
        reader = direct_endpoint.endpoint()
        first = peer("put", mixed_payload())
        assert_same_payload(await take(first), mixed_payload())
        assert peer.wait_in_use(0) == 0
        await asyncio.sleep(0.3)  # the free to ``peer`` is out: it may be dropped now
        second = other("put", mixed_payload())
        assert_same_payload(await take(second), mixed_payload())
        assert list(reader.loaded) == [second.handle.agent]
        assert list(reader.notes.owners) == [second.handle.agent]
        assert_same_payload(
            await take(peer("put", mixed_payload())), mixed_payload()
        )  # loaded again
        assert peer.wait_in_use(0) == 0 and other.wait_in_use(0) == 0
        assert list(reader.loaded) == [first.handle.agent]
    finally:
        other.close()


async def test_reads_that_start_while_a_reload_waits_let_it_go_first():
    """A reload waits for the reads from its owner under way; reads of older refs from that
    owner that start meanwhile wait for the reload, or a steady stream of them would hold it
    off until it timed out."""
    owner = Peer(_peer_main, OMNI_DIRECT_POOL_BYTES="0")  # every buffer is a one-read buffer
    try:
        older, read = owner("put", torch.zeros(1 << 16)), owner("put", torch.ones(1 << 16))
        assert torch.equal(await take(read), torch.ones(1 << 16))  # loads both buffers here
        assert owner.wait_in_use(1) == 1  # ``read`` freed and dropped; ``older`` still out
        newer = owner("put", torch.full((1 << 16,), 2.0))  # after a drop: a reload
        reader, agent = direct_endpoint.endpoint(), newer.handle.agent
        reloads = reader.reloads
        with reader.lock:
            reader.reading[agent] = 1  # a read from it is under way
        reloading = asyncio.ensure_future(take(newer))
        await asyncio.sleep(0.3)
        starting = asyncio.ensure_future(take(older))  # needs no reload of its own
        await asyncio.sleep(0.3)
        assert not reloading.done() and not starting.done()  # it waits for the reload
        with reader.lock:
            reader.reading[agent] = 0
            reader.reads_ended.notify_all()
        assert torch.equal(await asyncio.wait_for(reloading, 10), torch.full((1 << 16,), 2.0))
        assert torch.equal(await asyncio.wait_for(starting, 10), torch.zeros(1 << 16))
        assert reader.reloads == reloads + 1 and owner.wait_in_use(0) == 0
    finally:
        owner.close()


def test_the_owner_loop_stops_at_exit_before_the_interpreter_finalizes(monkeypatch):
    """A daemon thread still inside a NIXL call when the interpreter finalizes aborts the
    process (exit status 134 after every test of a run had passed)."""
    registered = []
    monkeypatch.setattr(direct_endpoint.atexit, "register", registered.append)
    monkeypatch.setattr(direct_endpoint, "_endpoint", None)
    owner = direct_endpoint.endpoint()
    DirectChannel().free(DirectChannel().put(torch.zeros(16)))  # starts the owner's loop
    assert registered == [owner._stop] and owner.thread.is_alive()
    owner._stop()
    assert not owner.thread.is_alive()
