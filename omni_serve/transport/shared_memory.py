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
import fcntl
import mmap
import os
import queue
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from omni_serve.transport.base import (
    ChannelError,
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
from omni_serve.transport.shm_pool import (
    FREE,
    HEADER,
    IN_USE,
    PREFIX,
    READ,
    Segment,
    SegmentPool,
    sweep_orphans,
)
from omni_serve.transport.shm_readers import ReaderMappings

__all__ = ["FREE", "HEADER", "IN_USE", "PREFIX", "READ", "SharedMemoryChannel", "sweep_orphans"]

_pool = SegmentPool()
atexit.register(_pool.close)
_readers = ReaderMappings()
os.register_at_fork(after_in_child=_readers.forget)
_live_views: dict[tuple[str, int], int] = {}  # consumer side: mappings not yet released


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[int | None]:
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

    def _claim(self, payload: Payload) -> tuple[dict[str, torch.Tensor], dict, Segment, TensorRef]:
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
