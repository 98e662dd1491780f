"""Text-to-image benchmark on small-qwen-image (24-layer DiT), 28 steps, in one run:

1. step caching: the DiT with the step cache of configs/pipelines/qwen_image_small.yaml against
   the same DiT uncached, per prompt: denoising time and PSNR of the decoded images;
2. the baseline: diffusers' ``QwenImagePipeline`` one request after another;
3. the served graph (that pipeline config) at concurrency 1 and 8: images per second.

    .venv/bin/python load_tests/bench_image.py     # 512x512, ~8 min

Writes load_tests/results/bench_image.json and prints a table. Targets (issue 6): step caching
>= 1.8x at PSNR >= 35 dB; served images/s reported against the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from omni_serve.config import load_pipeline_config
from omni_serve.models import ensure_model
from omni_serve.models.qwen_image.denoise import ImageJob
from omni_serve.models.qwen_image.stages import LatentDecoder, PromptEncoder, load_denoiser
from omni_serve.testing.serve_process import ServeProcess

URL = "http://127.0.0.1:8000"
PIPELINE = "configs/pipelines/qwen_image_small.yaml"
RESULTS = Path(__file__).parent / "results"
PROMPTS = [
    "a lighthouse on a cliff at dusk",
    "a bowl of ramen, studio lighting",
    "a red fox in fresh snow",
    "an old map of an imaginary island",
]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def bench_step_cache(model_dir: Path, size: int, steps: int) -> dict:
    config = load_pipeline_config(PIPELINE)
    settings = next(s for s in config.stages if s.kind == "dit").engine.step_cache
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
        rows.append(
            {
                "prompt": prompt,
                "uncached_s": plain_s,
                "cached_s": cached_s,
                "cached_steps": cached.last_cached_steps,
                "psnr_db": quality,
            }
        )
        print(
            f"  {prompt[:32]:34}{plain_s:6.2f}s -> {cached_s:5.2f}s {quality:5.1f} dB", flush=True
        )
    return {
        "settings": settings.model_dump(),
        "rows": rows,
        "speedup": sum(r["uncached_s"] for r in rows) / sum(r["cached_s"] for r in rows),
        "psnr_min_db": min(r["psnr_db"] for r in rows),
        "psnr_mean_db": statistics.mean(r["psnr_db"] for r in rows),
    }


def bench_diffusers(model_dir: Path, size: int, steps: int, requests: int) -> dict:
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    pipe("warm up", height=size, width=size, num_inference_steps=2)
    latencies = []
    start = time.perf_counter()
    for i in range(requests):
        begin = time.perf_counter()
        pipe(
            PROMPTS[i % len(PROMPTS)],
            height=size,
            width=size,
            num_inference_steps=steps,
            generator=torch.Generator().manual_seed(i),
        )
        latencies.append(time.perf_counter() - begin)
    wall = time.perf_counter() - start
    return {
        "requests": requests,
        "wall_s": wall,
        "images_per_s": requests / wall,
        "latency_p50_s": statistics.median(latencies),
    }


async def served_level(concurrency: int, requests: int, size: int, steps: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    latencies, errors = [], []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "size": f"{size}x{size}",
            "seed": i,
            "num_inference_steps": steps,
        }
        async with gate:
            begin = time.perf_counter()
            r = await client.post(f"{URL}/v1/images/generations", json=body)
            if r.status_code == 200:
                latencies.append(time.perf_counter() - begin)
            else:
                errors.append(r.text[:200])

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(one(client, i) for i in range(requests)))
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(errors),
        "error_samples": errors[:3],
        "wall_s": wall,
        "images_per_s": len(latencies) / wall,
        "latency_p50_s": statistics.median(latencies) if latencies else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--requests", type=int, default=16, help="served requests at c=8")
    args = parser.parse_args()
    model_dir = ensure_model("small-qwen-image")

    print(f"step cache: small-qwen-image {args.size}x{args.size}, {args.steps} steps", flush=True)
    cache = bench_step_cache(model_dir, args.size, args.steps)
    print("baseline: diffusers QwenImagePipeline, one request at a time", flush=True)
    baseline = bench_diffusers(model_dir, args.size, args.steps, requests=4)

    server = ServeProcess("graphs.qwen_image:build_app", URL, (f"pipeline_config={PIPELINE}",))
    server.start(timeout_s=600)
    try:
        asyncio.run(served_level(2, 2, args.size, args.steps))  # warm-up, not counted
        levels = []
        for concurrency, requests in [(1, 4), (8, args.requests)]:
            print(f"served: concurrency {concurrency}, {requests} requests", flush=True)
            levels.append(asyncio.run(served_level(concurrency, requests, args.size, args.steps)))
    finally:
        server.stop()

    by_c = {level["concurrency"]: level for level in levels}
    summary = {
        "model": "small-qwen-image",
        "size": args.size,
        "steps": args.steps,
        "step_cache": cache,
        "baseline": baseline,
        "served": levels,
        "ratios": {
            "step_cache_speedup": cache["speedup"],
            "step_cache_psnr_min_db": cache["psnr_min_db"],
            "images_per_s_c1_over_baseline": by_c[1]["images_per_s"] / baseline["images_per_s"],
            "images_per_s_c8_over_baseline": by_c[8]["images_per_s"] / baseline["images_per_s"],
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_image.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{'':12}{'images/s':>10}{'p50 s':>8}{'errors':>8}")
    print(f"{'diffusers':12}{baseline['images_per_s']:10.3f}{baseline['latency_p50_s']:8.2f}{0:8d}")
    for level in levels:
        name = f"served c={level['concurrency']}"
        print(
            f"{name:12}{level['images_per_s']:10.3f}{level['latency_p50_s'] or 0:8.2f}"
            f"{level['errors']:8d}"
        )
    print("ratios:", json.dumps(summary["ratios"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
