"""Run a denoising workload on a parallel DiT group outside Serve: one spawned process per
rank, as the DiT's worker actors would be. Used by the parallel tests and the benchmark.

Each rank runs one intra-op thread. ``workload`` is a picklable callable returning the
batches to denoise (each process builds them itself, so the jobs are identical on every
rank); rank 0's latents and per-batch seconds come back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from omni_serve.config import DiTParallelSettings
from omni_serve.models.qwen_image.denoise import ImageJob


def _rank(
    rank: int,
    settings: dict,
    init_method: str,
    path: str,
    workload: Callable[[], list[list[ImageJob]]],
    results: Any,  # a multiprocessing SimpleQueue
) -> None:
    from omni_serve.engines.diffusion.parallel import join_group, leave_group
    from omni_serve.models.qwen_image.parallel import load_parallel_denoiser

    parsed = DiTParallelSettings.model_validate(settings)
    torch.set_num_threads(1)  # one core's worth per rank; the OS spreads the ranks
    join_group(rank, parsed, init_method, path)
    denoiser = load_parallel_denoiser(path)
    outputs, seconds = [], []
    for batch in workload():
        start = time.perf_counter()
        latents = denoiser.run(batch)
        seconds.append(time.perf_counter() - start)
        outputs.append([lat.numpy().copy() for lat in latents])
    if rank == 0:
        results.put((outputs, seconds))
    leave_group()


def run_on_workers(
    path: str | Path,
    settings: DiTParallelSettings,
    workload: Callable[[], list[list[ImageJob]]],
) -> tuple[list[list[torch.Tensor]], list[float]]:
    """Rank 0's latents per batch, and its seconds per batch."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    args = (settings.model_dump(), f"tcp://127.0.0.1:{port}", str(path), workload, results)
    context = mp.start_processes(
        _rank, args, nprocs=settings.world_size, join=False, start_method="spawn"
    )
    # Read before joining: rank 0 blocks in put() while its result fills the pipe.
    while results.empty():
        if context.join(timeout=1):  # raises if a rank failed
            break
    outputs, seconds = results.get()
    while not context.join(timeout=1):
        pass
    return [[torch.from_numpy(a) for a in batch] for batch in outputs], seconds
