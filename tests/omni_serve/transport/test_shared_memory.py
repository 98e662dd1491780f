"""The shared-memory backend: zero-copy, copy-on-write reads; segments reused once their
readers are done; cleanup after a dead producer or consumer."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from omni_serve.transport import (
    AutoChannel,
    ChannelError,
    ChannelFull,
    SharedMemoryChannel,
    shm_pool,
    take,
)
from omni_serve.transport import shared_memory as shm


def _mapped_from(address: int) -> str | None:
    """The /dev/shm file that maps ``address`` in this process, if any."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end and len(parts) > 5:
                return os.path.basename(parts[5])
    return None


def _state(ref) -> int:
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        return shm.HEADER.unpack(f.read(shm.HEADER.size))[1]


async def test_reads_are_views_and_writes_stay_private():
    channel = SharedMemoryChannel()
    ref = channel.put(torch.arange(1024, dtype=torch.float32))
    first, second = await channel.get(ref), await channel.get(ref)
    assert _mapped_from(second.data_ptr()) == ref.key  # zero-copy: a view of the segment
    first[0] = -1.0
    assert second[0] == 0.0  # copy-on-write: the segment and other readers are untouched
    channel.free(ref)
    assert _state(ref) == shm.READ  # views still alive: not reusable yet
    assert second.sum() == sum(range(1024))
    del first, second
    gc.collect()
    assert _state(ref) == shm.FREE  # the last view died: back to the pool
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(ref)


async def test_abandon_frees_an_unread_ref_and_never_one_being_read():
    """What a caller does once a call carrying refs has ended: the ref nobody read (the call
    was cancelled while queued) is free at once; the one a consumer is reading stays its own."""
    channel = SharedMemoryChannel()
    unread, read = channel.put(torch.ones(512)), channel.put(torch.arange(512.0))
    view = await channel.get(read)
    channel.abandon(unread)
    channel.abandon(read)
    assert _state(unread) == shm.FREE and _state(read) == shm.READ
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(unread)
    reused = channel.put(torch.full((512,), 7.0))  # takes the freed segment, not the read one
    assert reused.key == unread.key and reused.key != read.key
    assert torch.equal(view, torch.arange(512.0))  # the reader's tensor is untouched
    del view
    gc.collect()
    assert _state(read) == shm.FREE  # handed back by its reader
    channel.abandon(unread)  # a stale abandon does not free the segment's next payload
    assert _state(reused) == shm.IN_USE


async def test_a_view_dying_while_this_process_holds_its_lock_is_released_later():
    """The GC may run a view's finalizer inside ``get`` (which holds a segment's lock): the
    release must not wait on that lock (it would wait forever); a helper thread does it."""
    channel = SharedMemoryChannel()
    ref = channel.put(torch.ones(64))
    view = await channel.get(ref)
    with shm._locked(shm.SHM_DIR / ref.key):
        del view
        gc.collect()
        assert _state(ref) == shm.READ  # returned at once, not handed back yet
    deadline = time.monotonic() + 5
    while _state(ref) != shm.FREE:
        assert time.monotonic() < deadline, "the helper never released the segment"
        time.sleep(0.01)


async def test_a_consumer_reading_while_the_caller_abandons_gets_a_clean_answer():
    """An abandon and a read of the same ref race from two processes: the read either wins
    (the ref stays in use) or fails with "freed"; never a read of a segment being reused.
    One reader, started once, takes each ref as it comes, so the abandon lands at varied
    points of its read."""
    channel = SharedMemoryChannel()
    script = (
        "import asyncio, pickle, sys, torch\n"
        "from omni_serve.transport import SharedMemoryChannel, ChannelError\n"
        "for line in sys.stdin:\n"
        "    ref = pickle.loads(bytes.fromhex(line))\n"
        "    try:\n"
        "        t = asyncio.run(SharedMemoryChannel().get(ref))\n"
        "        print('read', bool(torch.equal(t, torch.arange(4096.0))), flush=True)\n"
        "    except ChannelError:\n"
        "        print('freed', flush=True)\n"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    outcomes = []
    try:
        for i in range(40):
            ref = channel.put(torch.arange(4096.0))
            reader.stdin.write(pickle.dumps(ref).hex() + "\n")
            reader.stdin.flush()
            time.sleep(0.0005 * (i % 5))
            channel.abandon(ref)
            outcomes.append(reader.stdout.readline().strip())
    finally:
        reader.stdin.close()
        reader.wait(timeout=30)
    assert set(outcomes) <= {"read True", "freed"}, outcomes
    assert len(outcomes) == 40  # (which answers depends on timing)


async def test_a_released_segment_is_reused_and_stale_refs_stay_dead():
    channel = SharedMemoryChannel()
    ref = channel.put(torch.ones(300, 300))
    assert torch.equal(await take(ref), torch.ones(300, 300))  # the result dies right here
    gc.collect()
    again = channel.put(torch.zeros(200, 200))
    assert again.key == ref.key  # same pages, no new faults
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(ref)  # its generation is gone
    channel.free(ref)  # a late double free does not release the new payload
    assert torch.equal(await take(again), torch.zeros(200, 200))


async def test_dicts_and_payloads_beyond_the_pool_budget(fresh_pool, monkeypatch):
    monkeypatch.setattr(shm_pool, "POOL_BYTES", 0)
    big = torch.ones(1024, 1100)  # no pooled segment to reuse: an empty pool
    ref = SharedMemoryChannel().put({"a": big, 7: torch.zeros(3, dtype=torch.int8)})
    assert "-o-" in ref.key  # one-shot
    got = await take(ref)
    assert torch.equal(got["a"], big) and got[7].dtype == torch.int8
    del got
    gc.collect()
    assert not (shm.SHM_DIR / ref.key).exists()


async def test_a_ref_from_another_host_is_refused_with_the_fix():
    channel = SharedMemoryChannel()
    ref = channel.put(torch.ones(3))
    ref.handle = ("elsewhere", *ref.handle[1:])
    with pytest.raises(ChannelError, match="object_store"):
        await channel.get(ref)


async def test_a_ref_from_another_process_reads_back_and_its_orphan_is_swept(monkeypatch):
    monkeypatch.setattr(shm_pool, "SWEEP_EVERY_S", float("inf"))  # only the sweep below runs
    code = (
        "import os, pickle, sys, torch; from omni_serve.transport import SharedMemoryChannel;"
        "ref = SharedMemoryChannel().put(torch.arange(1000).view(10, 100).to(torch.bfloat16));"
        "sys.stdout.write(pickle.dumps(ref).hex()); sys.stdout.flush(); os._exit(0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    ref = pickle.loads(bytes.fromhex(out))
    dead = ref.key
    assert (shm.SHM_DIR / dead).exists()  # killed: no exit handler ran
    got = await SharedMemoryChannel().get(ref)  # read in this process
    assert torch.equal(got, torch.arange(1000).view(10, 100).to(torch.bfloat16))
    live = SharedMemoryChannel().put(torch.ones(10))
    assert shm.sweep_orphans() >= 1
    assert not (shm.SHM_DIR / dead).exists()
    assert (shm.SHM_DIR / live.key).exists()  # a live producer's pool stays


def test_a_segment_whose_consumer_died_is_reclaimed_after_the_lease(monkeypatch):
    channel = SharedMemoryChannel()
    lost = channel.put(torch.ones(100))  # nobody ever reads or frees it
    assert channel.put(torch.ones(100)).key != lost.key
    segment = shm._pool.segments[lost.key]
    gen, state, _ = segment.state()
    shm.HEADER.pack_into(segment.view, 0, gen, state, time.time() - 2 * shm_pool.LEASE_S)
    assert channel.put(torch.ones(100)).key == lost.key


def test_auto_uses_shared_memory_for_large_payloads_without_a_cluster():
    auto = AutoChannel(inline_max_bytes=1024)
    ref = auto.put(torch.zeros(4096))
    assert ref.backend == "shared_memory"
    auto.free(ref)


@pytest.fixture
def fresh_pool(monkeypatch):
    """This process's producer pool, empty; its segments unlinked afterwards."""
    pool = shm_pool.SegmentPool()
    monkeypatch.setattr(shm, "_pool", pool)
    yield pool
    pool.close()


async def test_a_new_size_over_the_budget_evicts_free_segments_not_ones_in_use(
    fresh_pool, monkeypatch
):
    pool = fresh_pool
    monkeypatch.setattr(shm_pool, "POOL_BYTES", 4 << 20)
    channel = SharedMemoryChannel()
    small = channel.put(torch.ones(3 << 18))  # 3 MB: a 4 MB segment, the whole budget
    held = await channel.get(small)  # in use: not evictable
    grown = channel.put(torch.ones(4 << 18))  # 4 MB + header: an 8 MB class, over the budget
    assert "-o-" in grown.key and (shm.SHM_DIR / small.key).exists()
    await take(grown)
    del held
    gc.collect()  # the last view of the small payload dies: its segment is free again
    channel.free(small)
    monkeypatch.setattr(shm_pool, "POOL_BYTES", 8 << 20)
    grown = channel.put(torch.ones(4 << 18))  # 4 + 8 > 8 MB: the free small one makes room
    assert "-p-" in grown.key and not (shm.SHM_DIR / small.key).exists()
    assert pool.pooled_bytes == 8 << 20 and list(pool.segments) == [grown.key]
    assert torch.equal(await take(grown), torch.ones(4 << 18))


async def test_a_cancelled_reservation_gives_its_segment_back_and_a_written_one_is_read(
    fresh_pool,
):
    channel = SharedMemoryChannel()
    like = {"k": torch.empty(256, 1024, device="meta")}
    channel.reserve(like).cancel()
    (segment,) = fresh_pool.segments.values()
    assert segment.state()[1] == shm.FREE
    reservation = channel.reserve(like)
    torch.arange(256 * 1024, out=reservation.tensors["k"].view(-1))  # written in place
    ref = reservation.commit()
    assert ref.key == segment.name and len(fresh_pool.segments) == 1  # the same segment, reused
    assert torch.equal((await take(ref))["k"].view(-1), torch.arange(256 * 1024.0))


@pytest.fixture
def small_shm(tmp_path):
    """A 16 MiB tmpfs, as a container's undersized /dev/shm (mounting needs root)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


FILL_SMALL_SHM = """
import sys, torch
from pathlib import Path
from omni_serve.transport import ChannelFull, shared_memory as shm, shm_pool
shm.SHM_DIR = shm_pool.SHM_DIR = Path(sys.argv[1])  # the reader's and the pool's
channel = shm.SharedMemoryChannel()
channel.free(channel.put(torch.ones(3 << 18)))  # 3 MB in a 4 MB segment, back in the pool
held = channel.put(torch.ones(10 << 18))  # a 16 MB segment: fits once the free one is gone
print("fits", len(list(shm.SHM_DIR.iterdir())), flush=True)
channel.free(held)
shm._pool.close()  # our segments go; a dead producer's fill the tmpfs instead:
(shm.SHM_DIR / "omni-shm-999999999-p-0").write_bytes(b"x" * (15 << 20))
held = channel.put(torch.ones(10 << 18))  # fits once the dead producer's segment is swept
print("fits", len(list(shm.SHM_DIR.iterdir())), flush=True)
try:
    channel.put(torch.ones(10 << 18))  # another 16 MB, the first still in use
except ChannelFull as exc:
    print("full:", exc)
"""


def test_a_full_shm_is_a_channel_full_error_not_a_crash(small_shm):
    """Writing past a full tmpfs is a SIGBUS that kills the replica: the pool sweeps dead
    producers' segments and drops its own free ones to make room, then says what is wrong."""
    done = subprocess.run(
        [sys.executable, "-c", FILL_SMALL_SHM, str(small_shm)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert lines[:2] == ["fits 1", "fits 1"], lines
    assert "no room for a 16 MiB segment" in lines[2] and "--shm-size" in lines[2], lines


def test_outside_ray_a_full_shm_is_raised_not_sent_to_a_ray_of_its_own(monkeypatch, fresh_pool):
    """vLLM's engine core (the KV connector's exports) is no Ray worker: ``ray.put`` there
    would start a Ray instance; the connector logs the export as failed instead."""
    import ray

    def full(size, pooled):
        raise ChannelFull("no room for a segment in /dev/shm")

    def no_put(*args, **kwargs):
        raise AssertionError("ray.put from a process outside Ray")

    monkeypatch.setattr(shm_pool, "create_segment", full)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "put", no_put)
    with pytest.raises(ChannelFull, match="no room"):
        AutoChannel(inline_max_bytes=1024).put(torch.zeros(4096))


async def test_closing_unlinks_the_pool_now_and_mapped_payloads_stay_readable():
    """What a stage replica does when Serve stops it (Serve ends it without exit handlers)."""
    from omni_serve import transport

    channel = SharedMemoryChannel()
    read = await take(channel.put(torch.arange(100_000, dtype=torch.float32)))
    unread = channel.put(torch.ones(100_000))
    names = set(shm._pool.segments)
    transport.close()
    assert names and not [n for n in names if (shm.SHM_DIR / n).exists()]
    assert torch.equal(read, torch.arange(100_000, dtype=torch.float32))
    with pytest.raises(ChannelError, match="freed"):
        await take(unread)
    again = channel.put(torch.ones(100_000))  # the process may go on: a new pool
    assert shm._pool.pooled_bytes == sum(s.size for s in shm._pool.segments.values()) > 0
    assert torch.equal(await take(again), torch.ones(100_000))
