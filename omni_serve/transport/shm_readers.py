"""Consumer side of the shared-memory backend: mappings of pooled segments, kept between reads.

Why: a fresh mapping's pages fault in on first touch. Reading a 16 MB payload right after its
``take`` took 1.16 ms, reading it again 0.33 ms (``in_process_ms`` in
load_tests/bench_channel.py): ~50 us per MB, as much as the producer's whole copy at 256 MB.
A producer's pool reuses a few segments, so a consumer reads the same ones again and again;
through the mapping it used before, the pages it touched are mapped already.

Copy-on-write still holds. The mapping is private, so a page a reader wrote is its own copy;
before the mapping serves the next payload those copies are dropped (``MADV_DONTNEED``: they
fault in again from the segment). ``/proc/self/pagemap`` says which pages they are (present
and not backed by the file, or swapped out); reading it costs 11-19 us per MB here, so the helper
thread does it as soon as the last reader's arrays die, off the next read's path (a read that
comes first cleans the mapping itself). Where pagemap cannot be read, every read gets a fresh
mapping, as before.

A kept mapping serves a read only when no tensor still views it (else that read gets a fresh
one), the kept ones stay within ``OMNI_SHM_READER_MAP_BYTES`` (least recently used go first),
and one whose segment is gone (evicted by its producer, or the producer exited) is dropped
within ``SWEEP_EVERY_S`` by that helper thread, reads or not: it keeps the segment's memory alive
(a /dev/shm that producers freed room in would stay full).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE = mmap.PAGESIZE
KEEP_BYTES = int(os.environ.get("OMNI_SHM_READER_MAP_BYTES", 2 << 30))
SWEEP_EVERY_S = 5.0
_PRESENT, _SWAPPED, _FILE = np.uint64(1 << 63), np.uint64(1 << 62), np.uint64(1 << 61)


def _private_mapping(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)


def written_pages(view: mmap.mmap) -> list[tuple[int, int]]:
    """(first, end) page runs of a private file mapping that are this process's own copies
    (written since mapped), per /proc/self/pagemap."""
    probe = np.frombuffer(view, dtype=np.uint8)
    address = probe.ctypes.data
    del probe  # an exported buffer would keep the mapping from closing
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)  # per call: /proc/self is per process
    try:
        raw = os.pread(fd, len(view) // PAGE * 8, address // PAGE * 8)
    finally:
        os.close(fd)
    entries = np.frombuffer(raw, dtype=np.uint64)
    own = ((entries & _PRESENT != 0) & (entries & _FILE == 0)) | (entries & _SWAPPED != 0)
    pages = np.flatnonzero(own)
    if pages.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(pages) != 1)
    starts = np.concatenate(([pages[0]], pages[breaks + 1]))
    ends = np.concatenate((pages[breaks], [pages[-1]])) + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _pagemap_works(directory: Path) -> bool:
    """Whether pagemap tells a written private page from a mapped file page here."""
    path = directory / f"omni-probe-{os.getpid()}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, 2 * PAGE)  # no room: ENOSPC here, not a SIGBUS on reading
        view = _private_mapping(fd, 2 * PAGE)
        try:
            _ = view[0]  # first page: mapped from the file
            view[PAGE] = 1  # second page: this process's copy
            return written_pages(view) == [(1, 2)]
        finally:
            view.close()
    except OSError:
        return False
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


@dataclass
class _Kept:
    view: mmap.mmap
    readers: int = 0  # arrays handed out over it and still alive
    clean: bool = True  # no page of it is this process's own copy (nothing written since)


class ReaderMappings:
    """This process's kept mappings, by segment name."""

    def __init__(self, budget: int = KEEP_BYTES) -> None:
        self.budget = budget
        self.kept: OrderedDict[str, _Kept] = OrderedDict()
        self.lock = threading.RLock()  # RLock: a finalizer may run inside a locked section
        self.enabled: bool | None = None  # decided on first use
        self.sweeper: threading.Thread | None = None
        self.unread: queue.SimpleQueue[str] = queue.SimpleQueue()  # mappings to clean
        self.directory: Path | None = None
        self.reused = 0  # reads served by a kept mapping (tests, benchmarks)

    def array(
        self, path: Path, fd: int, size: int, keep: bool
    ) -> tuple[np.ndarray, Callable[[], None] | None]:
        """A new uint8 array over the segment at ``path`` (``fd`` open; the caller holds its
        lock), and what to call when it dies (None: a mapping of its own, which dies with
        it). ``keep``: a pooled segment, worth keeping."""
        if self.enabled is None:
            self.enabled = _pagemap_works(path.parent)
        if not (keep and self.enabled):
            return np.frombuffer(_private_mapping(fd, size), dtype=np.uint8), None
        name = path.name
        with self.lock:
            if self.sweeper is None:
                self.directory = path.parent
                self.sweeper = threading.Thread(
                    target=self._sweep_every, daemon=True, name="omni-shm-readers"
                )
                self.sweeper.start()
            kept = self.kept.get(name)
            if kept is not None and kept.readers == 0 and len(kept.view) == size:
                if not self._clean(name, kept):  # pagemap stopped answering: map afresh
                    return np.frombuffer(_private_mapping(fd, size), dtype=np.uint8), None
                self.kept.move_to_end(name)
                self.reused += 1
            elif kept is None and self._room_for(size):
                kept = self.kept[name] = _Kept(_private_mapping(fd, size))
            else:  # still viewed by earlier reads, or no room: a mapping of its own
                return np.frombuffer(_private_mapping(fd, size), dtype=np.uint8), None
            kept.readers += 1
            kept.clean = False  # the reader may write to it
        return np.frombuffer(kept.view, dtype=np.uint8), lambda: self._unread(name, kept)

    def _clean(self, name: str, kept: _Kept) -> bool:
        """Drop the pages readers wrote (the caller holds the lock); False if pagemap cannot
        tell them any more (the mapping goes, and from now on every read maps afresh)."""
        if kept.clean:
            return True
        try:
            for first, end in written_pages(kept.view):
                kept.view.madvise(mmap.MADV_DONTNEED, first * PAGE, (end - first) * PAGE)
        except OSError:
            self.enabled = False
            self._drop(name)
            return False
        kept.clean = True
        return True

    def _room_for(self, size: int) -> bool:
        """Drop idle mappings, least recently used first, until ``size`` more fits."""
        used = sum(len(k.view) for k in self.kept.values())
        for name, kept in list(self.kept.items()):
            if used + size <= self.budget:
                break
            if kept.readers == 0:
                used -= len(kept.view)
                self._drop(name)
        return used + size <= self.budget

    def _unread(self, name: str, kept: _Kept) -> None:
        with self.lock:  # from a finalizer, any thread; reentrant if it runs inside a section
            kept.readers -= 1
            if kept.readers == 0:
                self.unread.put(name)  # SimpleQueue.put is safe in finalizers

    def _sweep_every(self) -> None:
        """Clean mappings as their readers finish; sweep gone segments every SWEEP_EVERY_S."""
        due = time.monotonic() + SWEEP_EVERY_S
        while True:
            if time.monotonic() >= due:  # first: a steady stream of reads must not hold it off
                self.sweep()
                due = time.monotonic() + SWEEP_EVERY_S
            try:
                name = self.unread.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                continue
            with self.lock:
                kept = self.kept.get(name)
                if kept is not None and kept.readers == 0:
                    self._clean(name, kept)

    def sweep(self) -> None:
        """Drop idle mappings whose segment is gone."""
        with self.lock:
            for name in [n for n, k in self.kept.items() if k.readers == 0]:
                if not (self.directory / name).exists():
                    self._drop(name)

    def _drop(self, name: str) -> None:
        kept = self.kept.pop(name)
        with contextlib.suppress(BufferError):  # viewed after all: GC unmaps it
            kept.view.close()

    def forget(self) -> None:
        """In a forked child: the parent's mappings are not this process's to reuse."""
        self.kept = OrderedDict()
        self.lock = threading.RLock()
        self.sweeper = None  # the parent's thread does not exist here
        self.unread = queue.SimpleQueue()
