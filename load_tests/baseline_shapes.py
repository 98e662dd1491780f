"""Baselines given the same cores as the served graph, in each shape a plain script could take.

A fair baseline uses all N cores the served side uses, in its best shape: N processes of one
torch thread each (every core busy with its own request), or one process with N threads.
``run_shapes`` runs all three shapes (1 x 1, 1 x N, N x 1) in fresh processes pinned to the
cores, so each starts from the same state; the best throughput is the one to compare with.

A baseline is a module-level function ``target(*args, threads=, ready=)`` that serves its
requests one after another in its process, calls ``ready`` after its warm-up (a barrier, so
that processes run at once) and returns ``{"wall_s", "records", "started"}``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable


def _process(core_set: list[int], threads: int, barrier, results, target, args: tuple) -> None:
    os.sched_setaffinity(0, set(core_set))
    results.put(target(*args, threads=threads, ready=barrier.wait))


def run_shape(
    target: Callable[..., dict], processes: int, threads: int, cores: list[int], args: tuple
) -> dict:
    """``processes`` fresh processes of ``threads`` threads each, on ``cores`` (one core per
    process when processes > 1, all of them otherwise), started together after their
    warm-ups. The level's wall time runs from the common start to the last one's end."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    pins = [[c] for c in cores[:processes]] if processes > 1 else [cores]
    workers = [
        ctx.Process(target=_process, args=(pins[i], threads, barrier, results, target, args))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    runs = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    start = min(r["started"] for r in runs)
    wall = max(r["started"] + r["wall_s"] for r in runs) - start
    records = [record for r in runs for record in r["records"]]
    return {
        "concurrency": processes,
        "wall_s": wall,
        "records": records,
        "processes": processes,
        "threads": threads,
        "cores": len(cores),
    }


def run_shapes(target: Callable[..., dict], cores: list[int], args: tuple) -> dict[str, dict]:
    """``{"1x1": ..., "1xN": ..., "Nx1": ...}`` (processes x threads); each process serves the
    requests ``args`` ask for."""
    n = len(cores)
    shapes = {"1x1": (1, 1, cores[:1])}
    if n > 1:
        shapes.update({f"1x{n}": (1, n, cores), f"{n}x1": (n, 1, cores)})
    return {name: run_shape(target, p, t, c, args) for name, (p, t, c) in shapes.items()}
