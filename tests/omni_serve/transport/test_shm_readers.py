"""Consumer-side mappings kept between reads: a reused mapping serves the new payload exactly
(pages an earlier reader wrote are dropped first, by the helper thread once that reader is
done), readers still viewing one are never disturbed, and the kept ones stay bounded."""

from __future__ import annotations

import gc
import mmap
import os
import threading
import time

import pytest
import torch

from omni_serve.transport import SharedMemoryChannel, shm_pool, shm_readers, take
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.shm_readers import PAGE, ReaderMappings, written_pages


@pytest.fixture
def readers(monkeypatch):
    """Fresh kept mappings for the backend (pagemap readable on this machine), and a fresh
    producer pool, so segment sizes do not depend on earlier tests."""
    fresh, pool = ReaderMappings(), shm_pool.SegmentPool()
    monkeypatch.setattr(shm, "_readers", fresh)
    monkeypatch.setattr(shm, "_pool", pool)
    yield fresh
    pool.close()


def test_written_pages_are_the_runs_this_process_copied(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"\0" * (12 * PAGE))
    fd = os.open(path, os.O_RDWR)
    view = mmap.mmap(fd, 12 * PAGE, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    _ = view[0], view[6 * PAGE]  # read: file pages, not copies
    for page in (3, 4, 10):
        view[page * PAGE + 7] = 1
    assert written_pages(view) == [(3, 5), (10, 11)]
    view.close()


async def test_a_reused_mapping_reads_the_new_payload_where_the_last_reader_wrote(readers):
    channel = SharedMemoryChannel()
    first = await take(channel.put(torch.zeros(1 << 20)))  # 4 MB: pooled segment
    first[::1024] = -1.0  # a write on every page: the reader's own copies
    del first
    gc.collect()
    second = await take(channel.put(torch.arange(1 << 20, dtype=torch.float32)))
    assert readers.reused == 1  # the same segment, through the kept mapping
    assert torch.equal(second, torch.arange(1 << 20, dtype=torch.float32))


async def test_a_read_while_the_kept_mapping_is_viewed_gets_its_own(readers):
    channel = SharedMemoryChannel()
    ref = channel.put(torch.arange(4096, dtype=torch.float32))
    first, second = await channel.get(ref), await channel.get(ref)
    first[0] = -1.0
    assert second[0] == 0.0 and first[0] == -1.0  # both private copies, neither disturbed
    assert readers.reused == 0
    channel.free(ref)


async def test_without_pagemap_every_read_maps_afresh(readers):
    readers.enabled = False
    channel = SharedMemoryChannel()
    for value in (1.0, 2.0):
        taken = await take(channel.put(torch.full((1 << 18,), value)))
        assert bool((taken == value).all())
        taken.fill_(-value)
        del taken
        gc.collect()
    assert readers.reused == 0 and not readers.kept


async def test_kept_mappings_stay_within_the_budget_and_drop_gone_segments(readers):
    readers.budget = 5 << 19  # 2.5 MiB: room for the 2 MiB mapping, not both
    channel = SharedMemoryChannel()
    small, large = torch.ones((1 << 18) - 1024), torch.ones((1 << 19) - 1024)  # 1, 2 MiB segments
    for payload in (small, large):
        held = await channel.get(ref := channel.put(payload))
        del held
        gc.collect()
        channel.free(ref)
    assert [len(k.view) for k in readers.kept.values()] == [2 << 20]  # the 1 MiB one went
    [name] = readers.kept
    shm._pool._unlink(shm._pool.segments[name])  # its producer evicts it
    assert readers.sweeper.is_alive()  # started with the first kept mapping
    readers.sweep()  # what the sweeper does every SWEEP_EVERY_S, reads or not
    assert name not in readers.kept  # it would keep the segment's memory alive


async def test_a_forked_child_keeps_none_of_its_parents_mappings():
    """The parent's kept mappings (and their reader counts) are not the child's to reuse."""
    channel = SharedMemoryChannel()
    held = await channel.get(channel.put(torch.ones(1 << 18)))
    assert shm._readers.kept  # the parent keeps one, viewed by ``held``
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not shm._readers.kept else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    del held


async def test_the_helper_cleans_a_mapping_when_its_reader_is_done_not_the_next_read(
    readers, monkeypatch
):
    """Finding the written pages costs 11-19 us per MB: the helper thread does it as soon as
    the last array over a kept mapping dies, so the next read of that segment does not."""
    channel = SharedMemoryChannel()
    taken = await take(channel.put(torch.zeros(1 << 18)))
    taken.fill_(-1.0)
    [kept] = readers.kept.values()
    assert written_pages(kept.view) and not kept.clean
    del taken
    gc.collect()
    deadline = time.monotonic() + 5.0
    while not kept.clean and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept.clean and written_pages(kept.view) == []
    looked: list[mmap.mmap] = []
    monkeypatch.setattr(shm_readers, "written_pages", lambda view: looked.append(view) or [])
    again = await take(channel.put(torch.ones(1 << 18)))
    assert readers.reused == 1 and looked == [] and bool((again == 1.0).all())


async def test_when_pagemap_stops_answering_reads_map_afresh(readers, monkeypatch):
    channel = SharedMemoryChannel()
    taken = await take(channel.put(torch.zeros(1 << 18)))
    taken.fill_(-1.0)

    def unreadable(view):
        raise PermissionError("pagemap")

    monkeypatch.setattr(shm_readers, "written_pages", unreadable)  # the helper's or the read's
    del taken
    gc.collect()
    again = await take(channel.put(torch.ones(1 << 18)))
    assert bool((again == 1.0).all()) and readers.enabled is False and not readers.kept


def test_the_sweep_runs_on_time_while_readers_keep_finishing(monkeypatch):
    """Mappings to clean waiting all the time (a busy consumer) do not hold off the sweep that
    lets go of evicted segments."""
    monkeypatch.setattr(shm_readers, "SWEEP_EVERY_S", 0.02)
    readers, sweeps = ReaderMappings(), []
    monkeypatch.setattr(readers, "sweep", lambda: sweeps.append(readers.unread.qsize()))
    for _ in range(300_000):  # as finalizers queue them when reads are done
        readers.unread.put("no-such-mapping")
    threading.Thread(target=readers._sweep_every, daemon=True).start()
    deadline = time.monotonic() + 5.0
    while not sweeps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sweeps and sweeps[0] > 0  # swept while names were still waiting
