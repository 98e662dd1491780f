"""Bounded async load against the served chat API: SSE speech requests at a fixed concurrency.

Loopback only. Each level runs a fixed number of requests and stops at a wall-clock cap.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from omni_serve.testing.playback import Playhead

SAMPLE_RATE = 24_000


@dataclass
class RequestRecord:
    ok: bool
    ttfp_s: float | None  # time to the first audio packet
    e2e_s: float
    audio_s: float
    error: str = ""
    # silence a listener hears after the first audio: a packet that arrives after everything
    # before it has played (the playhead waits), summed over the reply
    stall_s: float = 0.0
    # the server's own per-request timings (seconds from its start), off the finish chunk
    timings: dict[str, float] = field(default_factory=dict)


def speech_body(
    prompt: str,
    text_tokens: int,
    frames: int,
    seed: int,
    stop: list[str] | None = None,
    model: str = "qwen3-omni",
) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": text_tokens,
        "temperature": 0,
        "seed": seed,
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "pcm16"},
        "stage_overrides": {"talker": {"max_tokens": frames, "seed": seed}},
        **({"stop": stop} if stop else {}),
    }


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> RequestRecord:
    start = time.perf_counter()
    ttfp, pcm_bytes, timings = None, 0, {}
    playhead = Playhead()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return RequestRecord(False, None, time.perf_counter() - start, 0, r.text[:200])
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return RequestRecord(
                        False, ttfp, time.perf_counter() - start, 0, event["error"]["message"][:200]
                    )
                timings = event.get("timings", timings)
                for choice in event.get("choices", []):
                    audio = choice["delta"].get("audio")
                    if audio:
                        now = time.perf_counter() - start
                        ttfp = ttfp if ttfp is not None else now
                        pcm = len(base64.b64decode(audio["data"]))
                        pcm_bytes += pcm
                        playhead.arrive(now, pcm / 2 / SAMPLE_RATE)
    except httpx.HTTPError as exc:
        return RequestRecord(False, ttfp, time.perf_counter() - start, 0, repr(exc)[:200])
    audio_s = pcm_bytes / 2 / SAMPLE_RATE
    return RequestRecord(
        True, ttfp, time.perf_counter() - start, audio_s, timings=timings, stall_s=playhead.stall_s
    )


async def run_level(
    url: str,
    prompts: list[str],
    concurrency: int,
    requests: int,
    text_tokens: int,
    frames: int,
    cap_s: float,
    stop: list[str] | None = None,
    model: str = "qwen3-omni",
) -> dict:
    """Runs ``requests`` requests, at most ``concurrency`` at once, stopping at ``cap_s``."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    records: list[RequestRecord] = []
    start = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=cap_s, limits=limits) as client:

        async def worker() -> None:
            while time.perf_counter() - start < cap_s:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                prompt = prompts[i % len(prompts)]
                body = speech_body(prompt, text_tokens, frames, i, stop, model)
                records.append(await one_request(client, url, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {"concurrency": concurrency, "wall_s": wall, "records": [asdict(r) for r in records]}
