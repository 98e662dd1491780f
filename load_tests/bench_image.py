"""Text-to-image benchmark: the served Qwen-Image graph against diffusers on the same cores.

    .venv/bin/python load_tests/bench_image.py --repeats 3   # small-qwen-image 512x512, ~45 min
    .venv/bin/python load_tests/bench_image.py --quick       # tiny-qwen-image: a smoke run
    .venv/bin/python load_tests/bench_image.py --curve-only --repeats 2   # the served curve
                                                                          # with stage busy

Each repeat measures:
1. step caching, denoising only: the DiT with the pipeline's step cache against the same DiT
   uncached, per prompt (seconds, cached steps, PSNR of the decoded images), at two settings:
   the pipeline's (every other step cached: its threshold is out of the way) and a trained
   checkpoint's threshold (0.12; random weights change the residual by ~100% a step, so it
   caches nothing here);
2. the baseline: diffusers' ``QwenImagePipeline`` on the served graph's cores, in every shape
   (1 x 1, 1 x N, N x 1 processes x threads; ``baseline_shapes``);
3. the served graph at each concurrency of ``--levels`` (images/s, p50 latency, and each
   stage's busy seconds per wall second from ``/metrics``: which stage saturates where the
   curve bends), and the same graph without the step cache at c=1 and c=4: the cache's
   end-to-end speedup.

Writes docs/results/image.json (kept: medians and ranges over the repeats),
docs/img/image_concurrency.png and load_tests/results/bench_image.json (every record).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from baseline_shapes import run_shapes  # noqa: E402
from image_baseline import run_pipeline  # noqa: E402
from stage_busy import busy_per_wall_s, stage_busy  # noqa: E402
from summary import ROOT, spread, write_summary  # noqa: E402

from omni_serve.config import load_pipeline_config  # noqa: E402
from omni_serve.config.diffusion import StepCacheSettings  # noqa: E402
from omni_serve.models import ensure_model  # noqa: E402
from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

URL = "http://127.0.0.1:8000"
RESULTS = Path(__file__).parent / "results"
PROMPTS = [
    "a lighthouse on a cliff at dusk",
    "a bowl of ramen, studio lighting",
    "a red fox in fresh snow",
    "an old map of an imaginary island",
]
TRAINED_THRESHOLD = 0.12  # within the 0.1-0.2 a trained checkpoint caches well at
UNCACHED_LEVELS = (1, 4)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def bench_step_cache(model_dir: Path, settings: StepCacheSettings, size: int, steps: int) -> dict:
    from omni_serve.models.qwen_image.denoise import ImageJob
    from omni_serve.models.qwen_image.stages import LatentDecoder, PromptEncoder, load_denoiser

    encoder, decoder = PromptEncoder(model_dir), LatentDecoder(model_dir)
    plain, cached = load_denoiser(model_dir), load_denoiser(model_dir, step_cache=settings)
    warm = ImageJob(encoder.encode(["warm up"])[0], size, size, 2, seed=0)
    plain.run([warm]), cached.run([warm])
    rows = []
    for seed, prompt in enumerate(PROMPTS):
        job = ImageJob(encoder.encode([prompt])[0], size, size, steps, seed=seed)
        start = time.perf_counter()
        reference = plain.run([job])[0]
        plain_s = time.perf_counter() - start
        start = time.perf_counter()
        latents = cached.run([job])[0]
        cached_s = time.perf_counter() - start
        quality = psnr(decoder.decode(latents, size, size), decoder.decode(reference, size, size))
        rows.append((plain_s, cached_s, cached.last_cached_steps, quality))
    return {
        "speedup": sum(r[0] for r in rows) / sum(r[1] for r in rows),
        "cached_steps": statistics.mean(r[2] for r in rows),
        "psnr_min_db": min(r[3] for r in rows),
    }


async def served_level(concurrency: int, requests: int, size: int, steps: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies, errors = [], []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "size": f"{size}x{size}", "seed": i}
        async with gate:
            begin = time.perf_counter()
            r = await client.post(
                f"{URL}/v1/images/generations", json={**body, "num_inference_steps": steps}
            )
            if r.status_code == 200:
                latencies.append(time.perf_counter() - begin)
            else:
                errors.append(r.text[:200])

    before, start = await asyncio.to_thread(stage_busy, URL), time.perf_counter()
    async with httpx.AsyncClient(timeout=1200) as client:
        await asyncio.gather(*(one(client, i) for i in range(requests)))
    wall = time.perf_counter() - start
    after = await asyncio.to_thread(stage_busy, URL)
    return {
        "images_per_s": len(latencies) / wall,
        "latency_p50_s": statistics.median(latencies) if latencies else float("nan"),
        "errors": len(errors),
        "error_samples": errors[:3],
        "busy_per_wall_s": busy_per_wall_s(before, after, wall),
    }


def serve_levels(pipeline: Path, levels: list[int], rounds: int, size: int, steps: int) -> dict:
    server = ServeProcess("graphs.qwen_image:build_app", URL, (f"pipeline_config={pipeline}",))
    server.start(timeout_s=600)
    try:
        asyncio.run(served_level(2, 2, size, steps))  # warm-up, not counted
        out = {}
        for c in levels:
            print(f"  served {pipeline.name}: concurrency {c}", flush=True)
            out[f"c{c}"] = asyncio.run(served_level(c, max(4, rounds * c), size, steps))
        return out
    finally:
        server.stop()


def without_step_cache(pipeline: Path) -> Path:
    """The pipeline config with its DiT's step cache off (written beside the raw results)."""
    doc = yaml.safe_load(pipeline.read_text())
    for stage in doc["stages"]:
        if stage["kind"] == "dit":
            stage.setdefault("engine", {}).pop("step_cache", None)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{pipeline.stem}_uncached.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one_repeat(args, model_dir: Path, pipeline: Path, cores: list[int]) -> dict:
    config = load_pipeline_config(pipeline)
    forced = next(s for s in config.stages if s.kind == "dit").engine.step_cache
    forced = forced or StepCacheSettings(enabled=True, compute_first_blocks=1)
    trained = forced.model_copy(update={"residual_diff_threshold": TRAINED_THRESHOLD})
    print("step cache (denoising only)", flush=True)
    cache = {
        "forced": bench_step_cache(model_dir, forced, args.size, args.steps),
        "trained_threshold": bench_step_cache(model_dir, trained, args.size, args.steps),
    }
    print("baseline: diffusers on the same cores", flush=True)
    shapes = run_shapes(run_pipeline, cores, (model_dir, PROMPTS, 2, args.size, args.steps))
    baselines = {
        name: {
            "images_per_s": len(run["records"]) / run["wall_s"],
            "latency_p50_s": statistics.median(r["e2e_s"] for r in run["records"]),
            "processes": run["processes"],
            "threads": run["threads"],
        }
        for name, run in shapes.items()
    }
    served = serve_levels(pipeline, args.levels, args.rounds, args.size, args.steps)
    uncached = serve_levels(
        without_step_cache(pipeline), list(UNCACHED_LEVELS), args.rounds, args.size, args.steps
    )
    return {"step_cache": cache, "baselines": baselines, "served": served, "uncached": uncached}


def figures(runs: list[dict], levels: list[int]) -> dict:
    def over(get) -> dict:
        return spread([get(run) for run in runs])

    def best(run: dict) -> float:
        return max(b["images_per_s"] for b in run["baselines"].values())

    top = f"c{max(levels)}"
    keys = ("images_per_s", "latency_p50_s", "errors")
    return {
        "step_cache": {
            setting: {k: over(lambda r, s=setting, k=k: r["step_cache"][s][k]) for k in v}
            for setting, v in runs[0]["step_cache"].items()
        },
        "baselines": {
            name: {k: over(lambda r, n=name, k=k: r["baselines"][n][k]) for k in keys[:2]}
            for name in runs[0]["baselines"]
        },
        "served": {
            level: {k: over(lambda r, lv=level, k=k: r["served"][lv][k]) for k in keys}
            for level in runs[0]["served"]
        },
        "served_without_step_cache": {
            level: {k: over(lambda r, lv=level, k=k: r["uncached"][lv][k]) for k in keys}
            for level in runs[0]["uncached"]
        },
        "ratios": {
            f"served_{top}_over_best_baseline": over(
                lambda r: r["served"][top]["images_per_s"] / best(r)
            ),
            **{
                f"served_step_cache_speedup_c{c}": over(
                    lambda r, c=c: (
                        r["served"][f"c{c}"]["images_per_s"]
                        / r["uncached"][f"c{c}"]["images_per_s"]
                    )
                )
                for c in UNCACHED_LEVELS
                if f"c{c}" in runs[0]["served"]
            },
        },
    }


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(table["served"])
    xs = [int(level[1:]) for level in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, label in ((a, "images_per_s", "images/s"), (b, "latency_p50_s", "p50 (s)")):
        rows = [table["served"][level][key] for level in levels]
        med = [r["median"] for r in rows]
        low = [m - r["min"] for m, r in zip(med, rows, strict=True)]
        high = [r["max"] - m for m, r in zip(med, rows, strict=True)]
        err = [low, high]
        axis.errorbar(xs, med, yerr=err, marker="o", capsize=3, label="served")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(label)
    best = max(b["images_per_s"]["median"] for b in table["baselines"].values())
    a.axhline(best, color="gray", linestyle="--", label="diffusers, best same-core shape")
    a.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def curve_only(args, pipeline: Path) -> int:
    """The served curve alone, ``--repeats`` times: images/s, p50 latency and each stage's
    busy seconds per wall second at every level (medians and ranges)."""
    runs = [
        serve_levels(pipeline, args.levels, args.rounds, args.size, args.steps)
        for _ in range(args.repeats)
    ]
    table = {}
    for level in runs[0]:
        stages = sorted({s for run in runs for s in run[level]["busy_per_wall_s"]})
        table[level] = {
            "images_per_s": spread([run[level]["images_per_s"] for run in runs]),
            "latency_p50_s": spread([run[level]["latency_p50_s"] for run in runs]),
            "errors": sum(run[level]["errors"] for run in runs),
            "busy_per_wall_s": {
                s: spread([run[level]["busy_per_wall_s"].get(s, 0.0) for run in runs])
                for s in stages
            },
        }
    RESULTS.mkdir(exist_ok=True)
    out = {"pipeline": str(pipeline), "size": args.size, "steps": args.steps, "table": table}
    (RESULTS / "bench_image_curve.json").write_text(json.dumps({**out, "raw": runs}, indent=1))
    for level, row in table.items():
        busy = {s: round(v["median"], 2) for s, v in row["busy_per_wall_s"].items()}
        print(
            f"{level}: {row['images_per_s']['median']:.3f} images/s, p50 "
            f"{row['latency_p50_s']['median']:.1f} s, errors {row['errors']}, busy {busy}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny model, small images")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--levels", default="1,2,4,8,16", help="served concurrencies")
    parser.add_argument("--rounds", type=int, default=2, help="requests per level: rounds x c")
    parser.add_argument(
        "--curve-only",
        action="store_true",
        help="only the served curve with each stage's busy share (no baseline, no step cache "
        "runs); writes load_tests/results/bench_image_curve.json, not the kept summary",
    )
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    preset, pipeline = "small-qwen-image", ROOT / "configs/pipelines/qwen_image_small.yaml"
    if args.quick:
        preset, pipeline = "tiny-qwen-image", ROOT / "configs/pipelines/qwen_image_tiny.yaml"
        args.size, args.steps, args.levels, args.repeats = 128, 4, [1, 4], 1
    model_dir = ensure_model(preset)
    if args.curve_only:
        return curve_only(args, pipeline)
    cores = sorted(os.sched_getaffinity(0))
    runs = [one_repeat(args, model_dir, pipeline, cores) for _ in range(args.repeats)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_image.json").write_text(json.dumps(runs, indent=1))
    table = figures(runs, args.levels)
    if args.quick:
        print(json.dumps(table["ratios"], indent=1))
        return 0
    sides = {
        "served": {
            "model": preset,
            "pipeline": str(pipeline.relative_to(ROOT)),
            "cores": len(cores),
            "size": args.size,
            "steps": args.steps,
            "requests_per_level": f"max(4, {args.rounds} x concurrency)",
        },
        "baselines": {
            n: {"processes": b["processes"], "threads": b["threads"]}
            for n, b in runs[0]["baselines"].items()
        },
        "trained_threshold": TRAINED_THRESHOLD,
    }
    write_summary("image", table, sides, args.repeats)
    plot(table, ROOT / "docs/img/image_concurrency.png")
    print(json.dumps(table["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
