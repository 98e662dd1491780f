"""Soak: many requests at high concurrency, no errors and no memory growth per replica.

    .venv/bin/python load_tests/soak.py [--graph image|omni] [--requests 1000]
        [--concurrency 32] [--warmup 100] [--target ...] [--pipeline-config ...]

Serves a graph with every edge on the shared-memory channel: ``image`` (default) the tiny
Qwen-Image graph (small images, 2 steps), ``omni`` the tiny Qwen3-Omni graph (text and speech
out, the Talker capped at 16 codec frames per request; even requests a short spoken question:
encoder -> Thinker -> Talker -> Code2wav; odd ones a text turn of one of 64 sessions with a
228-token system prompt: each exports its prompt's KV, which the ingress keeps for that
session's next turn, which frees it or loads it), so the run is about the serving path, not
the model. Sends
``--warmup`` requests, records the resident memory (RSS) of every Serve replica and the proxy,
the shared-memory segments and the object store's usage, sends ``--requests`` more at
``--concurrency``, and records them again. Writes ``load_tests/results/soak.json``. Targets:
no failed request, private memory (USS) growth under 5% per process after warmup (issue 7);
segments and object store usage back where they were (issue 5's leak test). Also records the
``omni_channel_*`` series of /metrics at the end (``channel``: the backends payloads came by).
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

from omni_serve.testing.leaks import object_store_usage, shm_usage
from omni_serve.testing.serve_process import ServeProcess

URL = "http://127.0.0.1:8000"
RESULTS = Path(__file__).parent / "results"
TITLE = re.compile(r"^ray::(ServeReplica:[^:]+:\w+|ProxyActor)")
GRAPHS = {  # target, pipeline config, endpoint
    "image": (
        "graphs.qwen_image:build_app",
        "load_tests/configs/qwen_image_soak_pipeline.yaml",
        "/v1/images/generations",
    ),
    "omni": (
        "graphs.qwen3_omni:build_app",
        "load_tests/configs/qwen3_omni_soak_pipeline.yaml",
        "/v1/chat/completions",
    ),
}


SESSIONS = 64
SYSTEM = "You are a helpful voice assistant who answers briefly. " * 6


def request_body(graph: str, i: int) -> dict:
    if graph == "image":
        return {"prompt": "a small red kite", "size": "64x64", "num_inference_steps": 2, "seed": i}
    spoken_reply = {
        "model": "qwen3-omni",
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "max_tokens": 8,
        "seed": i,
        "stage_overrides": {"talker": {"max_tokens": 16, "seed": i}},
    }
    if i % 2:
        return {
            **spoken_reply,
            "session_id": f"soak-{i % SESSIONS}",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question number {i}?"},
            ],
        }
    return {
        **spoken_reply,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What did I say?"},
                    {"type": "input_audio", "input_audio": {"data": SPOKEN, "format": "wav"}},
                ],
            }
        ],
    }


def _spoken_question() -> str:
    """Half a second of a 440 Hz tone at 16 kHz, as a base64 WAV."""
    import base64
    import io

    import numpy as np
    import soundfile as sf

    buffer = io.BytesIO()
    t = np.arange(8000) / 16000
    sf.write(buffer, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


SPOKEN = _spoken_question()


def serve_processes() -> dict[str, psutil.Process]:
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if match := TITLE.match(cmdline):
            found[f"{match.group(1)}#{proc.info['pid']}"] = proc
    return found


def memory_mb(processes: dict[str, psutil.Process]) -> dict[str, dict[str, float] | None]:
    """RSS and USS per process. USS (private memory) is what a leak grows; RSS also counts
    the shared-memory channel's pages a replica has touched, which grows as more of the
    producers' pooled segments pass through it, without any leak."""
    out = {}
    for name, proc in processes.items():
        try:
            info = proc.memory_full_info()
            out[name] = {"rss": round(info.rss / 2**20, 1), "uss": round(info.uss / 2**20, 1)}
        except psutil.NoSuchProcess:
            out[name] = None
    return out


async def send(graph: str, n: int, concurrency: int) -> dict:
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
                r = await client.post(URL + GRAPHS[graph][2], json=request_body(graph, i))
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


def channel_metrics() -> dict[str, float]:
    """The ingress's ``omni_channel_*`` series at the end (one replica per stage): which
    backend each stage's payloads came by (the config pins shared memory: anything else
    would be a fallback), failed reads, overflows and pool sizes."""
    text = httpx.get(f"{URL}/metrics", timeout=30).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("omni_channel_")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--graph", choices=sorted(GRAPHS), default="image")
    parser.add_argument("--target", help="graph builder (default: the --graph's)")
    parser.add_argument("--pipeline-config", help="pipeline config (default: the --graph's)")
    args = parser.parse_args()
    args.target = args.target or GRAPHS[args.graph][0]
    args.pipeline_config = args.pipeline_config or GRAPHS[args.graph][1]
    builder_args = (f"pipeline_config={args.pipeline_config}",) if args.pipeline_config else ()
    server = ServeProcess(args.target, URL, builder_args)
    server.start()
    try:
        warmup = asyncio.run(send(args.graph, args.warmup, args.concurrency))
        processes = serve_processes()
        time.sleep(2)  # the last consumers hand their segments back
        before = memory_mb(processes)
        leaks_before = {"shm": shm_usage().as_dict(), "object_store": object_store_usage()}
        run = asyncio.run(send(args.graph, args.requests, args.concurrency))
        time.sleep(2)
        after = memory_mb(processes)
        leaks_after = {"shm": shm_usage().as_dict(), "object_store": object_store_usage()}
        channel = channel_metrics()
    finally:
        server.stop()
    growth = {
        kind: {
            name: round(100 * (after[name][kind] - before[name][kind]) / before[name][kind], 2)
            for name in before
            if before[name] and after.get(name)
        }
        for kind in ("rss", "uss")
    }
    summary = {
        "target": args.target,
        "pipeline_config": args.pipeline_config,
        "concurrency": args.concurrency,
        "warmup": warmup,
        "run": run,
        "failed": sum(v for k, v in run["statuses"].items() if k != "200"),
        "memory_mb_after_warmup": before,
        "memory_mb_at_end": after,
        "growth_pct": growth,
        "max_uss_growth_pct": max(growth["uss"].values(), default=None),
        "max_rss_growth_pct": max(growth["rss"].values(), default=None),
        "after_warmup": leaks_before,
        "at_end": leaks_after,
        "channel": channel,
    }
    RESULTS.mkdir(exist_ok=True)
    name = "soak.json" if args.graph == "image" else f"soak_{args.graph}.json"
    (RESULTS / name).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
