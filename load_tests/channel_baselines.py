"""The references ``bench_channel.py`` measures beside the channel, in its own process: a
single-thread memcpy (hot and cold) and the shared-memory put and take without actor calls."""

from __future__ import annotations

import statistics
import time

import torch

COLD_SPAN = 512 << 20  # 16x the L3: a cold memcpy's buffers


def memcpy_gbps(nbytes: int, repeats: int, cold: bool = False) -> float:
    """Single-thread copy rate. Hot: the same two buffers every time, so at 16 MB and below
    much of them stays in this CPU's 32 MB L3 (a cache copy, 1.3-3x DRAM speed here). Cold:
    pairs rotated over COLD_SPAN bytes, so each copy streams from and to DRAM, as a payload
    made elsewhere and a segment last written a round ago do."""
    torch.set_num_threads(1)
    pairs = max(1, COLD_SPAN // (2 * nbytes)) if cold else 1
    buffers = [(torch.ones(nbytes // 4), torch.empty(nbytes // 4)) for _ in range(pairs)]
    for src, dst in buffers:
        dst.copy_(src)  # pages touched before timing
    start = time.perf_counter()
    for i in range(repeats):
        src, dst = buffers[i % pairs]
        dst.copy_(src)
    return nbytes * repeats / (time.perf_counter() - start) / 1e9


def in_process_ms(nbytes: int, repeats: int) -> dict[str, float]:
    """The shared-memory put and take alone, in one process: what a round costs beyond the
    two actor calls; and what reading the taken payload costs the first time (its pages fault
    into the consumer's fresh mapping) and the second (mapped), which rounds do not count
    (their consumer answers the size without reading)."""
    import asyncio

    from omni_serve.transport import SharedMemoryChannel, take

    channel, tensor = SharedMemoryChannel(), torch.ones(nbytes // 4)

    async def rounds() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"put": [], "take": [], "read": [], "reread": []}
        for _ in range(repeats + 1):
            marks = [time.perf_counter()]
            ref = channel.put(tensor)
            marks.append(time.perf_counter())
            taken = await take(ref)
            marks.append(time.perf_counter())
            for _ in ("read", "reread"):
                taken.sum()
                marks.append(time.perf_counter())
            del taken  # the segment goes back
            for name, start, end in zip(times, marks[:-1], marks[1:], strict=True):
                times[name].append(end - start)
        return times  # the first put faults the new segment's pages in: dropped below

    times = asyncio.run(rounds())
    return {f"{name}_ms": statistics.median(t[1:]) * 1e3 for name, t in times.items()}
