"""How long work stalls an event loop: what every stream an ingress writes from that loop
waits. Used by the stall benchmarks (load_tests/bench_prompt_stall.py, bench_encode_stall.py).

A ticker asks to wake every millisecond while the work runs; its lateness is the stall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np

TICK_S = 0.001


async def _ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lateness.append(time.perf_counter() - asked - TICK_S)


async def burst(work: Callable[[Any], Awaitable[Any]], items: Iterable[Any]) -> dict[str, float]:
    """``work`` on every item at once; its wall time and the loop's stalls meanwhile (the
    longest, the 99th percentile, and the sum of those over 5 ms), in ms."""
    lateness: list[float] = []
    stop = asyncio.Event()
    ticks = asyncio.create_task(_ticker(stop, lateness))
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    await asyncio.gather(*(work(item) for item in items))
    wall = time.perf_counter() - start
    stop.set()
    await ticks
    late = np.array(lateness) * 1000
    return {
        "wall_s": round(wall, 3),
        "max_stall_ms": round(float(late.max()), 2),
        "p99_stall_ms": round(float(np.percentile(late, 99)), 2),
        "stalled_ms_total": round(float(late[late > 5].sum()), 2),
    }


def median(runs: list[dict[str, float]], key: str) -> float:
    return float(np.median([run[key] for run in runs]))
