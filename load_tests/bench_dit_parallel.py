"""Parallel DiT benchmark on small-qwen-image (24-layer DiT): one request with CFG, denoised by

1. one worker with two intra-op threads (both cores: the baseline),
2. Ulysses-2: two workers, one thread each (the image sequence split in two),
3. CFG-parallel-2: two workers, one thread each (one CFG branch each),

in one run, with each parallel output's max abs difference from the baseline's latents.

    .venv/bin/python load_tests/bench_dit_parallel.py     # 512x512, 8 steps, ~3 min

Writes load_tests/results/bench_dit_parallel.json and prints a table. On GPUs each worker
would have its own device; on this 2-core CPU the workers share the cores the baseline
already uses, so this measures the overhead of the parallel path more than its gain.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from omni_serve.config import DiTParallelSettings
from omni_serve.models import ensure_model
from omni_serve.models.qwen_image.denoise import ImageJob
from omni_serve.models.qwen_image.stages import PromptEncoder, load_denoiser
from omni_serve.testing.parallel_dit import run_on_workers

RESULTS = Path(__file__).parent / "results"


def workload(rows: dict[str, torch.Tensor], size: int, steps: int, rounds: int) -> list:
    """``rounds`` identical batches of one CFG request; the first one is the warm-up."""
    return [
        [ImageJob(rows["prompt"], size, size, steps, seed=3, negative_embeds=rows["negative"])]
        for _ in range(rounds)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small-qwen-image")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs after one warm-up")
    args = parser.parse_args()
    path = ensure_model(args.model)
    encoder = PromptEncoder(path)
    prompt, negative = encoder.encode(["a lighthouse on a cliff at dusk", "blurry, low quality"])
    work = functools.partial(
        workload, {"prompt": prompt, "negative": negative}, args.size, args.steps, args.rounds + 1
    )

    torch.set_num_threads(2)
    denoiser = load_denoiser(path)
    baseline, seconds = [], []
    for batch in work():
        start = time.perf_counter()
        baseline = denoiser.run(batch)
        seconds.append(time.perf_counter() - start)
    rows = {"one worker, 2 threads": {"seconds": min(seconds[1:]), "max_abs_diff": 0.0}}
    for name, settings in (
        ("ulysses 2 (2 workers x 1 thread)", DiTParallelSettings(ulysses_degree=2)),
        ("cfg parallel 2 (2 workers x 1 thread)", DiTParallelSettings(cfg_degree=2)),
    ):
        latents, took = run_on_workers(path, settings, work)
        diff = (latents[-1][0] - baseline[0]).abs().max().item()
        rows[name] = {"seconds": min(took[1:]), "max_abs_diff": diff}
    base = rows["one worker, 2 threads"]["seconds"]
    for row in rows.values():
        row["speedup"] = base / row["seconds"]
    result = {
        "model": args.model,
        "size": args.size,
        "steps": args.steps,
        "rounds": args.rounds,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_dit_parallel.json").write_text(json.dumps(result, indent=2))
    print(
        f"{args.model}, {args.size}x{args.size}, {args.steps} steps, one request with CFG "
        f"(best of {args.rounds})"
    )
    print(f"{'':40} {'seconds':>8} {'speedup':>8} {'max abs diff':>13}")
    for name, row in rows.items():
        print(f"{name:40} {row['seconds']:8.2f} {row['speedup']:7.2f}x {row['max_abs_diff']:13.2e}")


if __name__ == "__main__":
    main()
