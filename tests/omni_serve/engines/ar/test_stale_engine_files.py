from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from omni_serve.engines.ar.stale_engine_files import sweep_every, sweep_stale_engine_files


def _file(directory, name: str, age_s: float = 3600, data: bytes = b"") -> str:
    path = directory / name
    path.write_bytes(data)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return str(path)


def test_only_old_files_of_killed_engines_that_nobody_maps_or_holds_go(tmp_path):
    """What a SIGKILLed vLLM leaves goes; a live engine's queues (mapped by another process,
    or held open), one just being created, and other files stay."""
    dead = _file(tmp_path, "psm_dead", data=b"x" * 65536)
    dead_semaphore = _file(tmp_path, "sem.mp-dead")
    mapped = _file(tmp_path, "psm_mapped", data=b"x" * 4096)
    held = _file(tmp_path, "psm_held")
    young = _file(tmp_path, "psm_young", age_s=0)
    other = _file(tmp_path, "omni-shm-1-0")
    mapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
            "m = mmap.mmap(f.fileno(), 0); f.close(); print('mapped', flush=True); time.sleep(60)",
            mapped,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mapper.stdout.readline().strip() == "mapped"  # mapped only: its fd is closed
        with open(held, "rb"):
            swept = sweep_stale_engine_files(tmp_path)
    finally:
        mapper.kill()
        mapper.wait()
    assert sorted(swept.files) == ["psm_dead", "sem.mp-dead"]
    assert swept.bytes >= 65536  # the memory the dead queue held
    assert not os.path.exists(dead) and not os.path.exists(dead_semaphore)
    assert all(os.path.exists(p) for p in (mapped, held, young, other))
    # Once their process is gone (or closed them), they are stale too.
    assert sorted(sweep_stale_engine_files(tmp_path).files) == ["psm_held", "psm_mapped"]


async def test_a_running_engine_sweeps_again_what_dies_after_it_started(tmp_path):
    """A dead engine can outlive its replica for a while (still mapping its queues) when the
    replacement's engine starts: the later sweeps remove its files."""
    sweeper = asyncio.create_task(sweep_every(0.05, tmp_path))
    try:
        await asyncio.sleep(0.1)
        late = _file(tmp_path, "psm_died_later")
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not os.path.exists(late):
                break
        assert not os.path.exists(late)
    finally:
        sweeper.cancel()
