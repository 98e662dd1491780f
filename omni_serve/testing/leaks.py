"""What a leak check compares before and after a load: shared-memory segments and object
store usage. Used by ``load_tests/soak.py`` and the integration tests.

Shared-memory segments are pooled per producer and reused (transport/shared_memory.py), so a
healthy run keeps the same segments after warm-up, all of them free once requests finish; a
leak shows as more segments, more bytes, or segments left in use.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from omni_serve.transport.hosts import SHM_DIR
from omni_serve.transport.shm_pool import FREE, HEADER, PREFIX


@dataclass(frozen=True)
class ShmUsage:
    segments: int
    bytes: int
    in_use: int  # segments put and not handed back yet (read or not)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def shm_usage(directory: Path = SHM_DIR) -> ShmUsage:
    """Segments of live producers (a dead one's wait for the next sweep: not this run's)
    other than this process (what is measured is a served app; tests run earlier in the same
    pytest process may hold some on purpose)."""
    segments = size = in_use = 0
    for path in directory.glob(f"{PREFIX}*"):
        producer = path.name.removeprefix(PREFIX).split("-")[0]
        if not (producer.isdigit() and Path(f"/proc/{producer}").exists()):
            continue
        if int(producer) == os.getpid():
            continue
        with contextlib.suppress(FileNotFoundError):  # freed while we looked
            with path.open("rb") as f:
                header = f.read(HEADER.size)
            segments += 1
            size += path.stat().st_size
            if len(header) == HEADER.size and HEADER.unpack(header)[1] != FREE:
                in_use += 1
    return ShmUsage(segments, size, in_use)


def object_store_usage(dashboard: str = "http://127.0.0.1:8265") -> dict[str, int]:
    """Objects and bytes in the cluster's object store (Ray's state API, via the dashboard)."""
    from ray.util.state import list_objects

    objects = list_objects(address=dashboard, limit=10_000, raise_on_missing_output=False)
    return {"objects": len(objects), "bytes": sum(max(0, o.object_size or 0) for o in objects)}
