"""Soak: many requests at high concurrency, no errors and no memory growth per replica.

    .venv/bin/python load_tests/soak.py [--requests 1000] [--concurrency 32] [--warmup 100]
                                        [--target graphs.qwen_image:app]

Serves the target (default: the tiny Qwen-Image graph; small images, 2 steps, so the run is
about the serving path, not the model), sends ``--warmup`` requests, records the resident
memory (RSS) of every Serve replica and the proxy, sends ``--requests`` more at
``--concurrency``, and records it again. Writes ``load_tests/results/soak.json``. Targets
(issue 7): no failed request, memory growth under 5% per process after warmup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import psutil

from omni_serve.testing.serve_process import ServeProcess

URL = "http://127.0.0.1:8000"
RESULTS = Path(__file__).parent / "results"
TITLE = re.compile(r"^ray::(ServeReplica:[^:]+:\w+|ProxyActor)")
BODY = {"prompt": "a small red kite", "size": "64x64", "num_inference_steps": 2}


def serve_processes() -> dict[str, psutil.Process]:
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if match := TITLE.match(cmdline):
            found[f"{match.group(1)}#{proc.info['pid']}"] = proc
    return found


def rss_mb(processes: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, proc in processes.items():
        try:
            out[name] = round(proc.memory_info().rss / 2**20, 1)
        except psutil.NoSuchProcess:
            out[name] = None
    return out


async def send(n: int, concurrency: int) -> dict:
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.monotonic()
            try:
                r = await client.post(f"{URL}/v1/images/generations", json={**BODY, "seed": i})
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            statuses[key] = statuses.get(key, 0) + 1
            latencies.append(time.monotonic() - t0)

    limits = httpx.Limits(max_connections=concurrency)
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    latencies.sort()
    return {
        "requests": n,
        "statuses": statuses,
        "wall_s": round(time.monotonic() - started, 1),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "latency_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--target", default="graphs.qwen_image:app")
    args = parser.parse_args()
    server = ServeProcess(args.target, URL)
    server.start()
    try:
        warmup = asyncio.run(send(args.warmup, args.concurrency))
        processes = serve_processes()
        before = rss_mb(processes)
        run = asyncio.run(send(args.requests, args.concurrency))
        after = rss_mb(processes)
    finally:
        server.stop()
    growth = {name: round(100 * (after[name] - before[name]) / before[name], 2)
              for name in before if before[name] and after.get(name)}  # fmt: skip
    summary = {
        "target": args.target,
        "concurrency": args.concurrency,
        "warmup": warmup,
        "run": run,
        "failed": sum(v for k, v in run["statuses"].items() if k != "200"),
        "rss_mb_after_warmup": before,
        "rss_mb_at_end": after,
        "rss_growth_pct": growth,
        "max_rss_growth_pct": max(growth.values(), default=None),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
