"""The producer side of the shared-memory channel: this process's pool of POSIX shm segments
in /dev/shm, each with a 64-byte header (generation, state, time of the put), reused so that
a put writes into pages already touched; sized under a budget, evicting free segments least
recently used first; and the sweep that unlinks a dead producer's segments.
(``shared_memory`` says how the consumer reads and hands them back.)
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from omni_serve.transport.base import ChannelFull
from omni_serve.transport.hosts import SHM_DIR

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


def pid_alive(pid: int) -> bool:
    """Whether a segment's producer (the pid in its name) still runs."""
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
            if pid_alive(int(pid)) and (kind == "p" or now - path.stat().st_mtime < lease_s):
                continue
            path.unlink()
            removed += 1
        except (ValueError, FileNotFoundError):
            continue
    return removed


@dataclass
class Segment:
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


class SegmentPool:
    """This process's reusable segments (producer side)."""

    def __init__(self) -> None:
        self.segments: dict[str, Segment] = {}
        self.pooled_bytes = 0
        self.last_sweep = 0.0
        self.unlinking: list[Callable[[str], None]] = []  # told a segment's name before it goes

    def acquire(self, nbytes: int, one_shot: bool = True) -> tuple[Segment, bool]:
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
            segment = create_segment(size, pooled)
        except ChannelFull:  # room held by dead producers' segments, or by our free ones
            if not sweep_orphans() + self._unlink_free():
                raise
            segment = create_segment(size, pooled)
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

    def _unlink(self, segment: Segment) -> None:
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


def create_segment(size: int, pooled: bool) -> Segment:
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
    return Segment(name, size, view)
