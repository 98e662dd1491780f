from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from omni_serve.kv_store import disk_tier
from omni_serve.kv_store.disk_tier import DiskTier, PageRefused
from tests.omni_serve.kv_store.conftest import kept

TOKENS = list(range(256))  # 32 KiB of blocks: a page's header is small beside them


def _same(a, b) -> None:
    assert a.facts == b.facts
    assert a.kv.keys() == b.kv.keys()
    for name in a.kv:
        assert a.kv[name].dtype == b.kv[name].dtype
        assert torch.equal(a.kv[name], b.kv[name])
    assert (a.companion is None) == (b.companion is None)
    if a.companion is not None:
        assert torch.equal(a.companion, b.companion)


def test_a_page_comes_back_bit_exact_with_its_companion_rows(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20, "ns")
    prefix = kept(TOKENS, companion=True)
    prefix.kv = {k: v.to(torch.bfloat16) for k, v in prefix.kv.items()}
    assert disk.write("e1", prefix).result() is True
    _same(disk.read("e1"), prefix)
    assert disk.nbytes == disk._pages["e1"].path.stat().st_size


def test_a_restarted_tier_finds_its_pages_and_refuses_another_namespaces(tmp_path):
    first = DiskTier(tmp_path, 1 << 20, "ns")
    first.write("e1", kept(TOKENS)).result()
    again = DiskTier(tmp_path, 1 << 20, "ns")
    (page,) = again.scan()
    assert page.entry_id == "e1" and page.facts == kept(TOKENS).facts
    _same(again.read("e1"), kept(TOKENS))
    # Another model's page under our directory (copied in by hand, or a name collision):
    # its header names its own namespace, so it is refused and deleted, never loaded.
    other = DiskTier(tmp_path, 1 << 20, "ns-other")
    other.write("e2", kept(TOKENS, seed=5)).result()
    os.replace(other._pages["e2"].path, again.dir / "e2.kvpage")
    third = DiskTier(tmp_path, 1 << 20, "ns")
    assert [page.entry_id for page in third.scan()] == ["e1"] and third.refused == 1
    assert not (again.dir / "e2.kvpage").exists()


def test_a_damaged_page_is_refused_and_deleted_never_loaded(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20, "ns")
    disk.write("e1", kept(TOKENS)).result()
    path = disk._pages["e1"].path
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit in the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(PageRefused, match="checksum"):
        disk.read("e1")
    assert not path.exists() and "e1" not in disk and disk.refused == 1


def test_the_budget_is_never_exceeded_and_the_least_recently_used_page_goes(tmp_path):
    one = kept(TOKENS).nbytes
    disk = DiskTier(tmp_path, int(2.5 * one) + 4096, "ns")
    for i in range(2):
        disk.write(f"e{i}", kept(TOKENS, seed=i)).result()
    disk.read("e0")  # used: e1 is now the least recent
    disk.write("e2", kept(TOKENS, seed=2)).result()
    assert sorted(disk._pages) == ["e0", "e2"] and disk.evictions == 1
    assert disk.nbytes <= disk.max_bytes
    assert sorted(p.name for p in disk.dir.iterdir()) == ["e0.kvpage", "e2.kvpage"]
    assert disk.write("huge", kept(list(range(1024)))) is None  # never fits: not written


def test_a_full_disk_degrades_the_tier_and_costs_only_the_page(tmp_path, monkeypatch):
    disk = DiskTier(tmp_path, 1 << 20, "ns")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(disk_tier, "save_file", disk_full)
        assert disk.write("e1", kept(TOKENS)).result() is False
    assert "e1" not in disk and disk.nbytes == 0 and disk.write_errors == 1
    assert "No space left" in disk.degraded
    assert list(disk.dir.iterdir()) == []  # no partial page left behind
    assert disk.write("e2", kept(TOKENS)).result() is True
    assert disk.degraded is None  # a write that succeeds clears it


def test_a_directory_that_cannot_be_made_degrades_the_tier_from_the_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    disk = DiskTier(blocker, 1 << 20, "ns")
    assert disk.degraded and disk.write("e1", kept(TOKENS)) is None


def test_a_page_being_read_is_not_evicted_under_the_read(tmp_path, monkeypatch):
    """A write that needs room while a turn reads the only page on disk: the read still
    gets its prefix (it is not refused for a page that went away), and the budget holds."""
    prefix = kept(TOKENS)
    disk = DiskTier(tmp_path, 0, "ns")
    disk.max_bytes = prefix.nbytes + 4096  # room for one page (tensors and header)
    disk.write("e1", prefix).result()
    reading, written = threading.Event(), threading.Event()
    load_file = disk_tier.load_file

    def slow_load(path):
        reading.set()
        assert written.wait(10)
        return load_file(path)

    monkeypatch.setattr(disk_tier, "load_file", slow_load)
    with ThreadPoolExecutor(1) as pool:
        read = pool.submit(disk.read, "e1")
        assert reading.wait(10)
        assert disk.write("e2", kept(TOKENS, seed=3)) is None  # no room: e1 is being read
        written.set()
        _same(read.result(10), prefix)
    assert disk.refused == 0 and disk.evictions == 0 and disk.nbytes <= disk.max_bytes
    assert disk.write("e2", kept(TOKENS, seed=3)).result() is True  # read done: e1 goes
    assert disk.evictions == 1 and "e1" not in disk
