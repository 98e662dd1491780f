"""Step load against an autoscaling pipeline: replicas per stage over time, latency, errors.

    .venv/bin/python load_tests/bench_autoscale.py [--pipeline image|omni] [--low-s 20]
        [--high-s 60] [--idle-s 60] [--high-clients 8]

``image`` serves ``load_tests/configs/qwen_image_autoscale.yaml`` (tiny Qwen-Image; DiT and
VAE autoscale 1-2 replicas, the VAE following the DiT); ``omni`` serves
``load_tests/configs/qwen3_omni_autoscale.yaml`` (tiny Qwen3-Omni, streamed spoken replies;
the Talker autoscales 1-2 replicas on its queue and Code2wav follows the Talker). Both run
under ``omni_serve.scaling.pipeline_policy.PipelineAutoscalingPolicy``. Three phases: 1 client,
``--high-clients`` clients, 1 client again. Every second it records the RUNNING replicas of
each deployment (Serve's REST API on the dashboard). Writes
``load_tests/results/bench_autoscale[_omni].json`` and ``.png``: replicas per stage and request
latency over time. Reported: seconds from the step up to each autoscaled stage's second
replica (target ~15 s), seconds from the step down until it is gone again, latency (and for
speech TTFP) p50/p99 per phase, and failed requests (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from speech_load import one_request, speech_body  # noqa: E402

from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

URL = "http://127.0.0.1:8000"
DASHBOARD = "http://127.0.0.1:8265"
RESULTS = Path(__file__).parent / "results"
IMAGE_BODY = {"prompt": "a lighthouse", "size": "256x256", "num_inference_steps": 8}


@dataclass(frozen=True)
class Profile:
    config: str  # Serve config YAML
    app: str
    stages: tuple[str, ...]  # plotted
    scaled: tuple[str, ...]  # autoscaled: scale-up and scale-down times reported
    result: str  # file stem under load_tests/results


PROFILES = {
    "image": Profile(
        "load_tests/configs/qwen_image_autoscale.yaml",
        "qwen-image",
        ("text_encoder", "dit", "vae"),
        ("dit", "vae"),
        "bench_autoscale",
    ),
    "omni": Profile(
        "load_tests/configs/qwen3_omni_autoscale.yaml",
        "qwen3-omni",
        ("thinker", "talker", "code2wav"),
        ("talker", "code2wav"),
        "bench_autoscale_omni",
    ),
}


async def send_image(client: httpx.AsyncClient, _: int) -> tuple[int | str, float | None]:
    try:
        r = await client.post(f"{URL}/v1/images/generations", json=IMAGE_BODY)
    except httpx.HTTPError as exc:
        return type(exc).__name__, None
    return r.status_code, None


async def send_speech(client: httpx.AsyncClient, i: int) -> tuple[int | str, float | None]:
    """A streamed spoken reply (~4 s of audio); the status is 200 only if it completed."""
    body = speech_body("Tell me about the sea.", text_tokens=16, frames=50, seed=i)
    record = await one_request(client, URL, body)
    return (200 if record.ok else record.error or "failed"), record.ttfp_s


async def replicas_now(client: httpx.AsyncClient, app: str) -> dict[str, int]:
    r = await client.get(f"{DASHBOARD}/api/serve/applications/", timeout=10)
    deployments = r.json()["applications"][app]["deployments"]
    return {
        name: sum(1 for rep in d.get("replicas", []) if rep["state"] == "RUNNING")
        for name, d in deployments.items()
    }


async def sample_replicas(started: float, app: str, out: list, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient() as client:
        while not stop.is_set():
            # the dashboard may be busy for a moment: the next sample will do
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                out.append({"t": time.monotonic() - started, **await replicas_now(client, app)})
            await asyncio.sleep(1.0)


async def client_loop(started: float, until: float, phase: str, requests: list, send) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < until:
            t0 = time.monotonic()
            status, ttfp = await send(client, len(requests))
            requests.append(
                {
                    "t": t0 - started,
                    "phase": phase,
                    "status": status,
                    "latency_s": time.monotonic() - t0,
                    "ttfp_s": ttfp,
                }
            )


async def run(args: argparse.Namespace, profile: Profile) -> dict:
    replicas: list[dict] = []
    requests: list[dict] = []
    stop = asyncio.Event()
    started = time.monotonic()
    sampler = asyncio.create_task(sample_replicas(started, profile.app, replicas, stop))
    send = send_speech if args.pipeline == "omni" else send_image
    phases = [
        ("low", 1, args.low_s),
        ("high", args.high_clients, args.high_s),
        ("after", 1, args.idle_s),
    ]
    bounds = {}
    for phase, clients, seconds in phases:
        begin = time.monotonic()
        until = begin + seconds
        bounds[phase] = (begin - started, until - started)
        await asyncio.gather(
            *(client_loop(started, until, phase, requests, send) for _ in range(clients))
        )
    stop.set()
    await sampler
    return summarize(replicas, requests, bounds, profile)


def first_time(samples: list[dict], after: float, predicate) -> float | None:
    return next((s["t"] - after for s in samples if s["t"] >= after and predicate(s)), None)


def percentiles(values: list[float], prefix: str) -> dict[str, float | None]:
    values = sorted(values)
    if not values:
        return {f"{prefix}_p50_s": None, f"{prefix}_p99_s": None}
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return {
        f"{prefix}_p50_s": round(statistics.median(values), 3),
        f"{prefix}_p99_s": round(p99, 3),
    }


def summarize(replicas: list[dict], requests: list[dict], bounds: dict, profile: Profile) -> dict:
    high_start, high_end = bounds["high"]
    phases = {}
    for phase in bounds:
        ok = [r for r in requests if r["phase"] == phase and r["status"] == 200]
        phases[phase] = {
            "requests": sum(1 for r in requests if r["phase"] == phase),
            "failed": sum(1 for r in requests if r["phase"] == phase and r["status"] != 200),
            **percentiles([r["latency_s"] for r in ok], "latency"),
        }
        if any(r["ttfp_s"] is not None for r in ok):
            phases[phase].update(percentiles([r["ttfp_s"] for r in ok if r["ttfp_s"]], "ttfp"))
    return {
        "pipeline": profile.app,
        "scale_up_s": {
            s: first_time(replicas, high_start, lambda x, s=s: x.get(s, 0) >= 2)
            for s in profile.scaled
        },
        "scale_down_s": {
            s: first_time(replicas, high_end, lambda x, s=s: x.get(s, 0) == 1)
            if any(x.get(s, 0) >= 2 for x in replicas)
            else None
            for s in profile.scaled
        },
        "max_replicas": {
            s: max((x.get(s, 0) for x in replicas), default=0) for s in profile.stages
        },
        "failed_requests": sum(p["failed"] for p in phases.values()),
        "phases": phases,
        "bounds_s": bounds,
        "replicas": replicas,
        "requests": requests,
    }


def plot(summary: dict, stages: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for stage in stages:
        times = [x["t"] for x in summary["replicas"]]
        counts = [x.get(stage, 0) for x in summary["replicas"]]
        top.step(times, counts, where="post", label=stage)
    top.set_ylabel("running replicas")
    top.legend()
    ok = [r for r in summary["requests"] if r["status"] == 200]
    bad = [r for r in summary["requests"] if r["status"] != 200]
    bottom.scatter([r["t"] for r in ok], [r["latency_s"] for r in ok], s=4, label="ok")
    if bad:
        bottom.scatter(
            [r["t"] for r in bad], [r["latency_s"] for r in bad], s=12, c="red", label="failed"
        )
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
    parser.add_argument("--pipeline", choices=sorted(PROFILES), default="image")
    args = parser.parse_args()
    profile = PROFILES[args.pipeline]
    server = ServeProcess(profile.config, URL)
    server.start()
    try:
        summary = asyncio.run(run(args, profile))
    finally:
        server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{profile.result}.json").write_text(json.dumps(summary, indent=1))
    plot(summary, profile.stages, RESULTS / f"{profile.result}.png")
    brief = {
        k: summary[k]
        for k in ("scale_up_s", "scale_down_s", "max_replicas", "failed_requests", "phases")
    }
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
