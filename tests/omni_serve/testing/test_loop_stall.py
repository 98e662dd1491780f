"""The stall benchmarks' probe sees a loop blocked by work as a stall at least that long."""

from __future__ import annotations

import time

from omni_serve.testing.loop_stall import TICK_S, burst, median


async def test_blocking_work_on_the_loop_is_a_stall_at_least_as_long():
    async def blocking(seconds):
        time.sleep(seconds)

    stalls = await burst(blocking, [0.05, 0.05])  # run one after the other: 0.1 s blocked
    # lateness counts from the ticker's last wake-up (at or before the work began), less the
    # 1 ms tick it asked for
    assert stalls["wall_s"] >= 0.1 and stalls["max_stall_ms"] >= 100 - TICK_S * 1000
    assert stalls["stalled_ms_total"] >= stalls["max_stall_ms"]
    assert median([{"x": 1.0}, {"x": 3.0}, {"x": 2.0}], "x") == 2.0
