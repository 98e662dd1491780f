"""Step-level vs request-level batching in the DiT, on small-qwen-image (24-layer DiT).

Requests arrive one every ``interval`` seconds (a fixed schedule, so both modes see the same
arrivals), each with its own seed, all of one size, in two workloads: every request with the
same step count ("uniform"), and short and long requests alternating with the same mean
("mixed", e.g. a few-step preview next to a full render). The same denoiser runs

1. request level (what ``batching: request`` serves, and what the DiT did before step
   batching): when the denoiser is free, everything queued (up to max_batch_size) forms a batch
   that runs all its steps; a request arriving meanwhile waits for the whole batch;
2. step level (``batching: step``, the default): ``StepBatcher`` re-forms the batch before
   every step, so a request joins at the next step.

    .venv/bin/python load_tests/bench_step_batching.py     # 256x256, ~3 min

Writes load_tests/results/bench_step_batching.json and prints a table per workload: latency
per request (arrival to latents; for "mixed" also of the short requests alone), makespan and
images/s, and the ratio of mean latencies. On this CPU a batched step costs about the sum of
its rows (no batching gain to share), so for uniform requests step level is about even with
request level; what it changes is that no request waits for another's remaining steps.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from omni_serve.engines.diffusion.step_batching import StepBatcher
from omni_serve.models import ensure_model
from omni_serve.models.qwen_image.denoise import Denoiser, ImageJob
from omni_serve.models.qwen_image.stages import PromptEncoder, load_denoiser

RESULTS = Path(__file__).parent / "results"
BATCH_WAIT_S = 0.01  # the DiT's serve.batch wait


def request_level(denoiser: Denoiser, max_batch: int) -> tuple[Callable, Callable]:
    """submit(job, on_done) and close() of a loop that runs whole batches."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def loop() -> None:
        while (first := inbox.get()) is not None:
            time.sleep(BATCH_WAIT_S)
            batch = [first]
            while len(batch) < max_batch:
                try:
                    batch.append(inbox.get_nowait())
                except queue.Empty:
                    break
            groups: dict[tuple, list] = {}
            for job, on_done in batch:  # the DiT's serve.batch splits by size and steps
                groups.setdefault(job.shape_key, []).append((job, on_done))
            for group in groups.values():
                denoiser.run([job for job, _ in group])
                for _, on_done in group:
                    on_done()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return (lambda job, on_done: inbox.put((job, on_done))), (lambda: inbox.put(None))


def step_level(denoiser: Denoiser, max_batch: int) -> tuple[Callable, Callable]:
    batcher = StepBatcher(denoiser, max_batch)

    def submit(job: ImageJob, on_done: Callable) -> None:
        batcher.submit(job).add_done_callback(lambda _: on_done())

    return submit, batcher.close


def drive(mode: str, denoiser: Denoiser, jobs: list[ImageJob], interval: float, max_batch: int):
    submit, close = (request_level if mode == "request" else step_level)(denoiser, max_batch)
    arrived: list[float] = [0.0] * len(jobs)
    finished: list[float] = [0.0] * len(jobs)
    all_done = threading.Semaphore(0)
    start = time.perf_counter()
    for i, job in enumerate(jobs):
        time.sleep(max(0.0, start + i * interval - time.perf_counter()))
        arrived[i] = time.perf_counter()

        def on_done(i: int = i) -> None:
            finished[i] = time.perf_counter()
            all_done.release()

        submit(job, on_done)
    for _ in jobs:
        all_done.acquire()
    close()
    latencies = [f - a for a, f in zip(arrived, finished, strict=True)]
    makespan = max(finished) - start
    fewest = min(job.steps for job in jobs)
    short = [lat for lat, job in zip(latencies, jobs, strict=True) if job.steps == fewest]
    return {
        "latency_mean_s": statistics.mean(latencies),
        "short_latency_mean_s": statistics.mean(short),
        "latency_p50_s": statistics.median(latencies),
        "latency_max_s": max(latencies),
        "makespan_s": makespan,
        "images_per_s": len(jobs) / makespan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small-qwen-image")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="uniform workload's steps")
    parser.add_argument("--mixed", default="4,36", help="mixed workload's alternating steps")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument(
        "--spacing", type=float, default=0.8, help="arrival interval / one uniform request's time"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    path = ensure_model(args.model)
    (prompt,) = PromptEncoder(path).encode(["a lighthouse on a cliff at dusk"])
    denoiser = load_denoiser(path)

    def jobs(steps: list[int]) -> list[ImageJob]:
        return [
            ImageJob(prompt, args.size, args.size, steps[i % len(steps)], seed=i)
            for i in range(args.requests)
        ]

    denoiser.run(jobs([args.steps])[:1])  # warm-up
    start = time.perf_counter()
    denoiser.run(jobs([args.steps])[:1])
    single_s = time.perf_counter() - start
    interval = args.spacing * single_s
    print(f"one {args.steps}-step request alone: {single_s:.2f} s; one every {interval:.2f} s")
    workloads = {"uniform": [args.steps], "mixed": [int(n) for n in args.mixed.split(",")]}
    results = {}
    for name, steps in workloads.items():
        modes = {
            mode: drive(mode, denoiser, jobs(steps), interval, args.max_batch)
            for mode in ("request", "step")
        }
        ratio = modes["step"]["latency_mean_s"] / modes["request"]["latency_mean_s"]
        results[name] = {"steps": steps, "modes": modes, "mean_latency_step_vs_request": ratio}
        print(f"\n{name} (steps {steps})")
        print(
            f"{'mode':<8} {'mean s':>8} {'short s':>8} {'p50 s':>8} {'max s':>8} "
            f"{'makespan':>8} {'img/s':>7}"
        )
        for mode, r in modes.items():
            keys = [
                "latency_mean_s",
                "short_latency_mean_s",
                "latency_p50_s",
                "latency_max_s",
                "makespan_s",
            ]
            row = " ".join(f"{r[k]:>8.2f}" for k in keys)
            print(f"{mode:<8} {row} {r['images_per_s']:>7.3f}")
        print(f"mean latency, step / request level: {ratio:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    result = {
        "model": args.model,
        "size": args.size,
        "requests": args.requests,
        "max_batch": args.max_batch,
        "single_request_s": single_s,
        "interval_s": interval,
        "workloads": results,
    }
    (RESULTS / "bench_step_batching.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
