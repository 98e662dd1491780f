"""Shared-memory backend: POSIX shm segments in /dev/shm, for stages on the same host.

Speed comes from reuse: writing into FRESH shared pages runs at ~1.5 GB/s on this CPU (page
faults and zeroing), into already-touched ones at memcpy speed. So each producer process keeps
a pool of segments (``omni-shm-<pid>-p-<id>``; one-shot ones are ``-o-``), copies a payload
into a free one, and the consumer maps it copy-on-write and gets tensors that VIEW it
(zero-copy; writing to them touches only the consumer's private pages).

A segment's 64-byte header holds a generation, a state (free / in use / read) and the time of
the put. The consumer marks it read when it maps it, and hands it back when the last tensor
viewing it dies (a finalizer on its mapping flips the state to free), or on ``free`` if it
never read it; a ref whose generation no longer matches is "freed". A caller whose call failed
or was cancelled ``abandon``s the refs it carried: freed if no consumer read them (the call
never ran, or failed before reading), left to the consumer otherwise. State changes hold an
exclusive ``flock`` on the segment, so an abandon and a read cannot both win.

Crash cleanup: a segment in use for longer than the lease is reclaimed by its producer (its
consumer died); segments of a dead producer are unlinked by ``sweep_orphans``, which every
producer runs now and then. A new segment that would take the pool past its budget makes room
by unlinking free segments, least recently used first; payloads that still do not fit get a
one-shot segment that ``free`` unlinks.

A segment's pages are reserved when it is made: a write to a page tmpfs has no room for is a
SIGBUS, which kills the process (a container's /dev/shm is 64 MB unless sized). A segment
that does not fit raises ``ChannelFull`` once dead producers' segments and the pool's free ones
are gone too.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import itertools
import mmap
import os
import queue
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_serve.transport.base import (
    ChannelError,
    ChannelFull,
    Payload,
    Reservation,
    TensorRef,
    layout,
    named_tensors,
    pack,
    payload_spec,
    unpack,
)
from omni_serve.transport.hosts import SHM_DIR, host_id
from omni_serve.transport.shm_readers import ReaderMappings

PREFIX = "omni-shm-"
HEADER = struct.Struct("<QQd")  # generation, state, time of the put
FREE, IN_USE, READ = 0, 1, 2  # READ: a consumer has mapped it (and will hand it back)
LEASE_S = 600.0  # a segment in use for longer than this has lost its consumer
SWEEP_EVERY_S = 30.0
POOL_BYTES = int(os.environ.get("OMNI_SHM_POOL_BYTES", 2 << 30))
MIN_SEGMENT = 1 << 20
# One count over all of this process's segments, not one per segment: a ref read over NIXL
# names an address and a generation (see ``shared_memory_direct``), and a new segment mapped at
# an unlinked one's address must never show a stale ref's generation.
_claims = itertools.count(1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(lease_s: float = LEASE_S) -> int:
    """Unlink segments whose producer is dead, and one-shot segments nobody freed within the
    lease (pooled segments of live producers are theirs to reclaim); how many went."""
    removed, now = 0, time.time()
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        try:
            pid, kind, _ = path.name.removeprefix(PREFIX).split("-")
            if _pid_alive(int(pid)) and (kind == "p" or now - path.stat().st_mtime < lease_s):
                continue
            path.unlink()
            removed += 1
        except (ValueError, FileNotFoundError):
            continue
    return removed


@dataclass
class _Segment:
    name: str
    size: int
    view: mmap.mmap  # the producer's shared mapping, kept open: its pages stay touched
    generation: int = 0

    def state(self) -> tuple[int, int, float]:
        return HEADER.unpack_from(self.view, 0)

    def claim(self) -> int:
        self.generation = next(_claims)
        HEADER.pack_into(self.view, 0, self.generation, IN_USE, time.time())
        return self.generation


class _SegmentPool:
    """This process's reusable segments (producer side)."""

    def __init__(self) -> None:
        self.segments: dict[str, _Segment] = {}
        self.pooled_bytes = 0
        self.last_sweep = 0.0
        self.unlinking: list[Callable[[str], None]] = []  # told a segment's name before it goes

    def acquire(self, nbytes: int, one_shot: bool = True) -> tuple[_Segment, bool]:
        """A free segment of at least ``nbytes`` (the caller claims it after writing), and
        whether it returns to the pool. Without ``one_shot``, ``ChannelFull`` rather than a
        segment outside the pool."""
        if time.monotonic() - self.last_sweep > SWEEP_EVERY_S:
            self.last_sweep = time.monotonic()
            sweep_orphans()
        now, usable = time.time(), []
        for segment in self.segments.values():
            if segment.size >= nbytes:
                _, state, since = segment.state()
                if state == FREE or now - since > LEASE_S:
                    usable.append(segment)
        if usable:
            return min(usable, key=lambda s: s.size), True
        size = max(MIN_SEGMENT, 1 << (nbytes - 1).bit_length())
        pooled = self.pooled_bytes + size <= POOL_BYTES or self._evict(size)
        if not pooled and not one_shot:
            raise ChannelFull(
                f"a {nbytes / 2**20:.0f} MiB payload does not fit this process's shared-memory"
                f" pool ({POOL_BYTES / 2**20:.0f} MiB, OMNI_SHM_POOL_BYTES) beside the segments"
                " in use"
            )
        if not pooled:
            size = nbytes
        try:
            segment = _create(size, pooled)
        except ChannelFull:  # room held by dead producers' segments, or by our free ones
            if not sweep_orphans() + self._unlink_free():
                raise
            segment = _create(size, pooled)
        if pooled:
            self.segments[segment.name] = segment
            self.pooled_bytes += size
        return segment, pooled

    def _evict(self, size: int) -> bool:
        """Make room for a new ``size`` segment under the budget by unlinking free segments,
        least recently put first; False (nothing unlinked) if even all of them are too few.
        Why: payloads that grow (a session's KV prefix, turn after turn) leave segments of
        smaller sizes behind; without eviction they fill the budget and every later payload
        gets a one-shot segment, whose fresh pages cost far more to write than the copy."""
        states = {name: segment.state() for name, segment in self.segments.items()}
        free = sorted(
            (s for s in self.segments.values() if states[s.name][1] == FREE),
            key=lambda s: states[s.name][2],
        )
        if self.pooled_bytes - sum(s.size for s in free) + size > POOL_BYTES:
            return False
        for segment in free:
            if self.pooled_bytes + size <= POOL_BYTES:
                break
            self._unlink(segment)
        return True

    def _unlink_free(self) -> int:
        """Unlink every free segment (/dev/shm is full); how many went."""
        free = [s for s in self.segments.values() if s.state()[1] == FREE]
        for segment in free:
            self._unlink(segment)
        return len(free)

    def _unlink(self, segment: _Segment) -> None:
        for hook in self.unlinking:
            hook(segment.name)
        del self.segments[segment.name]
        self.pooled_bytes -= segment.size
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SHM_DIR / segment.name)
        with contextlib.suppress(BufferError):  # a view still exported: GC unmaps it
            segment.view.close()

    def close(self) -> None:
        """At exit: unlink our segments (consumers' mappings stay valid)."""
        for name in self.segments:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SHM_DIR / name)
        self.segments.clear()
        self.pooled_bytes = 0

    def unlink_all(self) -> None:
        """Unlink every segment now, in use or not, each as an eviction does (whoever lent
        it is told first); the process may go on putting into new ones."""
        for segment in list(self.segments.values()):
            self._unlink(segment)


def _create(size: int, pooled: bool) -> _Segment:
    name = f"{PREFIX}{os.getpid()}-{'p' if pooled else 'o'}-{uuid.uuid4().hex[:16]}"
    path = SHM_DIR / name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)  # the pages now, or ENOSPC: never a SIGBUS later
        except OSError as exc:
            path.unlink()
            if exc.errno != errno.ENOSPC:
                raise
            free = os.statvfs(SHM_DIR)
            raise ChannelFull(
                f"no room for a {size / 2**20:.0f} MiB segment in {SHM_DIR} "
                f"({free.f_bavail * free.f_frsize / 2**20:.0f} MiB free): give it more (docker "
                "--shm-size, a Memory emptyDir on /dev/shm in Kubernetes) or pin the edge's "
                "channel to object_store"
            ) from None
        view = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    HEADER.pack_into(view, 0, 0, FREE, time.time())
    return _Segment(name, size, view)


_pool = _SegmentPool()
atexit.register(_pool.close)
_readers = ReaderMappings()
os.register_at_fork(after_in_child=_readers.forget)
_live_views: dict[tuple[str, int], int] = {}  # consumer side: mappings not yet released


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True):
    """The segment's fd under an exclusive flock (None if the segment is gone). Not
    blocking: BlockingIOError if someone, this process included, holds the lock."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        yield None  # freed one-shot, or its producer exited
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield fd
        finally:
            # Explicitly: an mmap made from fd dups it, which would keep the lock held.
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_deferred: queue.SimpleQueue = queue.SimpleQueue()
_deferred_thread: threading.Thread | None = None


def _release_later_if_locked(path: Path, generation: int, pooled: bool) -> None:
    """Release from a finalizer. The GC may run one while this very thread holds a segment's
    lock (inside ``get``), and a second flock on the same file would wait forever: if the lock
    is taken, a helper thread waits for it instead."""
    global _deferred_thread
    try:
        _release(path, generation, pooled, blocking=False)
        return
    except BlockingIOError:
        pass
    _deferred.put((path, generation, pooled))  # SimpleQueue.put is safe in finalizers
    if _deferred_thread is None:
        _deferred_thread = threading.Thread(target=_release_deferred, daemon=True)
        _deferred_thread.start()


def _release_deferred() -> None:
    while True:
        _release(*_deferred.get())


def _set_state(fd: int, state: int) -> None:
    os.pwrite(fd, struct.pack("<Q", state), 8)


def _release(
    path: Path, generation: int, pooled: bool, unread_only: bool = False, blocking: bool = True
) -> None:
    """The segment is done with: back to its producer's pool (or gone, if one-shot). With
    ``unread_only``, only if no consumer has read it."""
    with _locked(path, blocking) as fd:
        if fd is None:
            return
        current, state, _ = HEADER.unpack(os.pread(fd, HEADER.size, 0))
        if current != generation or state == FREE:  # reused already, or a second free
            return
        if unread_only and state != IN_USE:
            return
        if pooled:
            _set_state(fd, FREE)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _views_gone(key: tuple[str, int], path: Path, pooled: bool) -> None:
    _live_views[key] -= 1
    if _live_views[key] == 0:
        del _live_views[key]
        _release_later_if_locked(path, key[1], pooled)


def producer_segment(name: str) -> tuple[mmap.mmap, Callable[[], bool]]:
    """This process's mapping of its pooled segment ``name``, and whether a payload in it is
    still unread (READ: a consumer here has mapped it, and needs nothing of the producer)."""
    segment = _pool.segments[name]
    return segment.view, lambda: segment.state()[1] == IN_USE


def release_segment(name: str, generation: int, unread_only: bool = False) -> None:
    """Hand this process's pooled segment back for a reader that cannot: on another host."""
    _release(SHM_DIR / name, generation, True, unread_only)


def unlink_pool() -> None:
    """This process's segments go now (see ``transport.close``)."""
    _pool.unlink_all()


def pool_bytes() -> int:
    """Bytes of shared memory this process's pool holds (segments free or in use)."""
    return _pool.pooled_bytes


def on_unlink(hook: Callable[[str], None]) -> None:
    """Have ``hook(name)`` called before this process unlinks one of its pooled segments."""
    _pool.unlinking.append(hook)


class SharedMemoryChannel:
    """``pooled_only``: a payload the pool cannot take raises ``ChannelFull`` instead of
    getting a one-shot segment."""

    name = "shared_memory"

    def __init__(self, pooled_only: bool = False) -> None:
        self.pooled_only = pooled_only

    def put(self, payload: Payload) -> TensorRef:
        tensors, offsets, segment, ref = self._claim(payload)
        try:
            pack(tensors, offsets, torch.frombuffer(segment.view, dtype=torch.uint8))
        except BaseException:
            self.free(ref)
            raise
        if not ref.handle[-1]:  # one-shot: the consumer maps it by name
            segment.view.close()
        return ref

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        """A segment to write into (host memory whatever ``device`` asks)."""
        _, offsets, segment, ref = self._claim(like)
        _, _, _, _, keys, _ = ref.handle
        views = unpack(torch.frombuffer(segment.view, dtype=torch.uint8), ref, offsets, keys)
        return Reservation(views, lambda: ref, lambda: self.free(ref))

    def _claim(self, payload: Payload) -> tuple[dict[str, torch.Tensor], dict, _Segment, TensorRef]:
        """A segment for ``payload``, in use from now on, and the ref that will name it."""
        nbytes, spec = payload_spec(payload)
        tensors, keys = named_tensors(payload)
        offsets, needed = layout(tensors)
        segment, pooled = _pool.acquire(needed, one_shot=not self.pooled_only)
        generation = segment.claim()
        handle = (host_id(), generation, segment.size, offsets, keys, pooled)
        return tensors, offsets, segment, TensorRef(self.name, segment.name, nbytes, spec, handle)

    async def get(self, ref: TensorRef) -> Payload:
        host, generation, size, offsets, keys, pooled = ref.handle
        if host != host_id():
            raise ChannelError(
                f"shared-memory ref {ref.key} lives on host {host}, read on {host_id()}, which "
                "cannot map its /dev/shm (another machine, or a container with a /dev/shm of "
                "its own): use the object_store (or direct) backend for cross-host edges"
            )
        path = SHM_DIR / ref.key
        with _locked(path) as fd:
            if fd is None:
                raise ChannelError(f"ref {ref.key} was freed (or its producer died)")
            current, state, _ = HEADER.unpack(os.pread(fd, HEADER.size, 0))
            # READ again: a consumer that died mid-call; its call is being retried.
            if current != generation or state == FREE:
                raise ChannelError(f"ref {ref.key} was freed")
            _set_state(fd, READ)
            # Copy-on-write: consumers get writable tensors without touching the segment.
            array, unread = _readers.array(path, fd, size, keep=pooled)
        key = (ref.key, generation)
        _live_views[key] = _live_views.get(key, 0) + 1
        if unread is not None:  # a kept mapping: free for the next read once this dies
            weakref.finalize(array, unread)
        weakref.finalize(array, _views_gone, key, path, pooled)
        # Every tensor views the one array, which lives until the last of them dies.
        return unpack(torch.from_numpy(array), ref, offsets, keys)

    def free(self, ref: TensorRef) -> None:
        """Done with ``ref``: its segment is released now, or when this process's tensors
        viewing it die (so ``take`` may free right after reading)."""
        _, generation, _, _, _, pooled = ref.handle
        if (ref.key, generation) not in _live_views:
            _release(SHM_DIR / ref.key, generation, pooled)

    def abandon(self, ref: TensorRef) -> None:
        """The call carrying ``ref`` failed or was cancelled: free it unless a consumer read
        it (that one hands it back itself; freeing it under its views would let the producer
        overwrite tensors still in use)."""
        host, generation, _, _, _, pooled = ref.handle
        if host == host_id():
            _release(SHM_DIR / ref.key, generation, pooled, unread_only=True)
