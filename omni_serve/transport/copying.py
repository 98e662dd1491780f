"""The one copy a channel makes (into its shared memory or landing buffer), split over a few
threads for large payloads.

Why: that copy is most of what a large payload costs on one host, and one thread does not
use all the memory bandwidth a second core adds. Measured here (2 cores, ``bench_channel.py``
with ``--copy-threads 1`` vs 2, three runs each): a put's added time at 64 MB 3.3-3.4 ms on one
thread, 3.05-3.1 ms on two; at 256 MB 12.9-14.5 ms vs 11.7-12.0 ms. torch's ``copy_`` releases
the GIL, so plain threads split it even inside an actor that runs torch single-threaded. Below
``PARALLEL_FROM`` waking a helper costs more than it saves (16 MB in an actor: 0.94-1.02 ms
split vs 0.88-0.93 ms not). ``OMNI_CHANNEL_COPY_THREADS=1`` copies on the caller's thread only.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

PART_ALIGN = 4096  # parts start on page boundaries, so no two threads write one cache line
COPY_THREADS = max(1, int(os.environ.get("OMNI_CHANNEL_COPY_THREADS", min(4, os.cpu_count() or 1))))
# Bytes; below this a copy stays on the caller's thread. Measured on 2 cores only: a machine
# with more memory channels per core may gain from lower (OMNI_CHANNEL_SPLIT_COPY_FROM).
PARALLEL_FROM = int(os.environ.get("OMNI_CHANNEL_SPLIT_COPY_FROM", 32 << 20))
MIN_PART = max(PART_ALIGN, PARALLEL_FROM // 2)  # bytes; no thread gets less than this

_helpers: ThreadPoolExecutor | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    global _helpers
    if _helpers is None:
        _helpers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="omni-copy")
    return _helpers


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist there, and an executor
    that still counts them starts no new ones, so a split copy would wait forever."""
    global _helpers
    _helpers = None


os.register_at_fork(after_in_child=_forget_helpers)


def parts(nbytes: int, threads: int = COPY_THREADS) -> list[tuple[int, int]]:
    """(start, end) byte ranges covering ``nbytes``: one per thread that gets at least
    ``MIN_PART``; a single range when the copy stays on one thread."""
    count = min(threads, nbytes // MIN_PART) if nbytes >= PARALLEL_FROM else 1
    if count <= 1:
        return [(0, nbytes)]
    step = -(-nbytes // count // PART_ALIGN) * PART_ALIGN
    return [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]


def copy_bytes(dst: torch.Tensor, src: torch.Tensor, threads: int = COPY_THREADS) -> None:
    """``dst.copy_(src)`` for flat uint8 tensors of one length; split over threads when both
    live in host memory and the copy is large."""
    ranges = parts(src.numel(), threads) if dst.is_cpu and src.is_cpu else [(0, src.numel())]
    if len(ranges) == 1:
        dst.copy_(src)
        return
    helpers = _pool(max(1, COPY_THREADS - 1))
    pending = [helpers.submit(dst[a:b].copy_, src[a:b]) for a, b in ranges[1:]]
    try:
        dst[ranges[0][0] : ranges[0][1]].copy_(src[ranges[0][0] : ranges[0][1]])
    finally:
        for done in pending:
            done.result()
