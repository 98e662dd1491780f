"""Where a video is encoded, and what other streams feel: the encoder stage against the
Thinker's own vLLM, in one run.

    .venv/bin/python load_tests/bench_video_encode.py     # ~6 min

Served tiny Qwen3-Omni (``configs/pipelines/qwen3_omni_tiny.yaml``) twice: as configured (a
video without audio goes to the encoder stage, which patches and encodes it while the Thinker
keeps stepping), and with the encoder stage dropped (the Thinker's vLLM encodes the video inside
an engine step, and every other request in that engine waits for it). A round: 4 streamed text
chats decoding up to 1,024 tokens each; once they stream, 2 chats with a 28 s video (320x240,
56 frames at the API's 2 fps), new videos every round. Measured: the text streams' gaps between
chunks that overlap the videos' time in flight (what a listener hears as a stall), and the
video chats' latency. Writes
``load_tests/results/bench_video_encode.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from omni_serve.testing.media import video_file
from omni_serve.testing.serve_process import REPO, ServeProcess

RESULTS = Path(__file__).parent / "results"
URL = "http://127.0.0.1:8000"
TINY = REPO / "configs" / "pipelines" / "qwen3_omni_tiny.yaml"
TEXT_STREAMS, VIDEO_CHATS = 4, 2


def pipeline_without_encoder(directory: Path) -> Path:
    config = yaml.safe_load(TINY.read_text())
    config["stages"] = [s for s in config["stages"] if s["kind"] != "encoder"]
    config["edges"] = [e for e in config["edges"] if "encoder" not in (e["source"], e["target"])]
    path = directory / "qwen3_omni_tiny_no_encoder.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def video_part(seed: int) -> dict:
    frames = np.random.default_rng(seed + 1000).integers(0, 255, (56, 240, 320, 3), dtype=np.uint8)
    data = base64.b64encode(video_file(frames, rate=2)).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}


async def text_stream(client: httpx.AsyncClient, arrivals: list[float]) -> None:
    body = {
        "model": "qwen3-omni",
        "stream": True,
        "max_tokens": 1024,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Tell a long story."}],
    }
    async with client.stream("POST", f"{URL}/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content"' in line:
                arrivals.append(time.perf_counter())


async def video_chat(client: httpx.AsyncClient, part: dict) -> float:
    content = [part, {"type": "text", "text": "What happens?"}]
    body = {
        "model": "qwen3-omni",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }
    began = time.perf_counter()
    r = await client.post(f"{URL}/v1/chat/completions", json=body)
    r.raise_for_status()
    return time.perf_counter() - began


async def one_round(videos: list[dict]) -> dict:
    async with httpx.AsyncClient(timeout=300) as client:
        arrivals: list[list[float]] = [[] for _ in range(TEXT_STREAMS)]
        streams = [asyncio.create_task(text_stream(client, a)) for a in arrivals]
        while min(len(a) for a in arrivals) < 10:  # all streaming
            await asyncio.sleep(0.05)
        began = time.perf_counter()
        latencies = await asyncio.gather(*(video_chat(client, v) for v in videos))
        ended = time.perf_counter()
        await asyncio.gather(*streams)
    gaps = [
        (later - earlier) * 1000
        for a in arrivals
        for earlier, later in zip(a, a[1:], strict=False)
        if later >= began and earlier <= ended  # overlaps the videos' time in flight
    ]
    return {
        "video_latency_s": [round(x, 3) for x in latencies],
        "gaps_during_videos": len(gaps),
        "max_gap_ms": round(max(gaps), 1) if gaps else None,
        "p99_gap_ms": round(float(np.percentile(gaps, 99)), 1) if gaps else None,
        "p50_gap_ms": round(float(np.percentile(gaps, 50)), 1) if gaps else None,
    }


def serve_and_measure(pipeline: Path, videos: list[list[dict]]) -> list[dict]:
    server = ServeProcess("graphs.qwen3_omni:build_app", args=(f"pipeline_config={pipeline}",))
    server.start()
    try:
        asyncio.run(one_round([video_part(-1)]))  # warm-up: first encode, first prefill
        return [asyncio.run(one_round(round_videos)) for round_videos in videos]
    finally:
        server.stop()


def main(rounds: int) -> dict:
    # New videos every round, the same in both modes: a video sent again would hit vLLM's
    # caches (its processor's and the prefix cache) in one mode, and not the encoder stage.
    videos = [[video_part(r * VIDEO_CHATS + i) for i in range(VIDEO_CHATS)] for r in range(rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        modes = {"encoder_stage": TINY, "in_thinker": pipeline_without_encoder(Path(tmp))}
        runs = {mode: serve_and_measure(path, videos) for mode, path in modes.items()}

    def median(mode: str, key: str) -> float:
        return float(np.median([r[key] for r in runs[mode] if r[key] is not None]))

    summary = {
        "rounds": rounds,
        "runs": runs,
        "max_gap_ms": {m: median(m, "max_gap_ms") for m in runs},
        "p99_gap_ms": {m: median(m, "p99_gap_ms") for m in runs},
        "video_latency_s": {
            m: float(np.median([x for r in runs[m] for x in r["video_latency_s"]])) for m in runs
        },
    }
    summary["max_gap_ratio_encoder_over_thinker"] = round(
        summary["max_gap_ms"]["encoder_stage"] / summary["max_gap_ms"]["in_thinker"], 3
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_video_encode.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per mode")
    print(json.dumps(main(parser.parse_args().rounds), indent=1))
