"""Step load against an autoscaling pipeline: replicas per stage over time, latency, errors.

    .venv/bin/python load_tests/bench_autoscale.py [--low-s 20] [--high-s 60] [--idle-s 60]

Serves ``load_tests/configs/qwen_image_autoscale.yaml`` (tiny Qwen-Image; DiT and VAE
autoscale 1-2 replicas under ``omni_serve.routing.autoscaling.PipelineAutoscalingPolicy``),
then runs three phases: 1 client, ``--high-clients`` clients, 1 client again. Every second it
records the RUNNING replicas of each deployment (Serve's REST API on the dashboard). Writes
``load_tests/results/bench_autoscale.json`` and ``bench_autoscale.png``: replicas per stage
and request latency over time. Reported: seconds from the step up to the DiT's second replica
(target ~15 s), seconds from the step down until it is gone again, latency p50/p99 per phase,
and failed requests (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path

import httpx

from omni_serve.testing.serve_process import ServeProcess

URL = "http://127.0.0.1:8000"
DASHBOARD = "http://127.0.0.1:8265"
RESULTS = Path(__file__).parent / "results"
STAGES = ("text_encoder", "dit", "vae")
BODY = {"prompt": "a lighthouse", "size": "256x256", "num_inference_steps": 8}


async def replicas_now(client: httpx.AsyncClient) -> dict[str, int]:
    r = await client.get(f"{DASHBOARD}/api/serve/applications/", timeout=10)
    deployments = r.json()["applications"]["qwen-image"]["deployments"]
    return {name: sum(1 for rep in d.get("replicas", []) if rep["state"] == "RUNNING")
            for name, d in deployments.items()}  # fmt: skip


async def sample_replicas(started: float, out: list, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient() as client:
        while not stop.is_set():
            # the dashboard may be busy for a moment: the next sample will do
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                out.append({"t": time.monotonic() - started, **await replicas_now(client)})
            await asyncio.sleep(1.0)


async def client_loop(started: float, until: float, phase: str, requests: list) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < until:
            t0 = time.monotonic()
            try:
                r = await client.post(f"{URL}/v1/images/generations", json=BODY)
                status = r.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            requests.append({"t": t0 - started, "phase": phase, "status": status,
                             "latency_s": time.monotonic() - t0})  # fmt: skip


async def run(args: argparse.Namespace) -> dict:
    replicas: list[dict] = []
    requests: list[dict] = []
    stop = asyncio.Event()
    started = time.monotonic()
    sampler = asyncio.create_task(sample_replicas(started, replicas, stop))
    phases = [("low", 1, args.low_s), ("high", args.high_clients, args.high_s),
              ("after", 1, args.idle_s)]  # fmt: skip
    bounds = {}
    for phase, clients, seconds in phases:
        begin = time.monotonic()
        until = begin + seconds
        bounds[phase] = (begin - started, until - started)
        await asyncio.gather(*(client_loop(started, until, phase, requests)
                               for _ in range(clients)))  # fmt: skip
    stop.set()
    await sampler
    return summarize(replicas, requests, bounds)


def first_time(samples: list[dict], after: float, predicate) -> float | None:
    return next((s["t"] - after for s in samples if s["t"] >= after and predicate(s)), None)


def summarize(replicas: list[dict], requests: list[dict], bounds: dict) -> dict:
    high_start, high_end = bounds["high"]
    phases = {}
    for phase in bounds:
        lat = sorted(r["latency_s"] for r in requests if r["phase"] == phase and r["status"] == 200)
        phases[phase] = {
            "requests": sum(1 for r in requests if r["phase"] == phase),
            "failed": sum(1 for r in requests if r["phase"] == phase and r["status"] != 200),
            "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
            "latency_p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3)
            if lat
            else None,
        }
    return {
        "scale_up_s": {s: first_time(replicas, high_start, lambda x, s=s: x.get(s, 0) >= 2)
                       for s in ("dit", "vae")},
        "scale_down_s": {s: first_time(replicas, high_end, lambda x, s=s: x.get(s, 0) == 1)
                         if any(x.get(s, 0) >= 2 for x in replicas) else None
                         for s in ("dit", "vae")},
        "max_replicas": {s: max((x.get(s, 0) for x in replicas), default=0) for s in STAGES},
        "failed_requests": sum(p["failed"] for p in phases.values()),
        "phases": phases,
        "bounds_s": bounds,
        "replicas": replicas,
        "requests": requests,
    }  # fmt: skip


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for stage in STAGES:
        times = [x["t"] for x in summary["replicas"]]
        counts = [x.get(stage, 0) for x in summary["replicas"]]
        top.step(times, counts, where="post", label=stage)
    top.set_ylabel("running replicas")
    top.legend()
    ok = [r for r in summary["requests"] if r["status"] == 200]
    bad = [r for r in summary["requests"] if r["status"] != 200]
    bottom.scatter([r["t"] for r in ok], [r["latency_s"] for r in ok], s=4, label="ok")
    if bad:
        bottom.scatter([r["t"] for r in bad], [r["latency_s"] for r in bad], s=12, c="red",
                       label="failed")  # fmt: skip
    bottom.set_ylabel("latency (s)")
    bottom.set_xlabel("seconds")
    bottom.legend()
    for start, _ in summary["bounds_s"].values():
        for ax in (top, bottom):
            ax.axvline(start, color="grey", lw=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--low-s", type=float, default=20)
    parser.add_argument("--high-s", type=float, default=60)
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--high-clients", type=int, default=8)
    args = parser.parse_args()
    server = ServeProcess("load_tests/configs/qwen_image_autoscale.yaml", URL)
    server.start()
    try:
        summary = asyncio.run(run(args))
    finally:
        server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_autoscale.json").write_text(json.dumps(summary, indent=1))
    plot(summary, RESULTS / "bench_autoscale.png")
    brief = {k: summary[k] for k in ("scale_up_s", "scale_down_s", "max_replicas",
                                     "failed_requests", "phases")}  # fmt: skip
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
