"""What the Thinker's ``stats()`` costs its engine: it asks vLLM's worker for its channel counts
(``collective_rpc``, run between two engine steps) at every ``/metrics`` scrape and every
``OMNI_METRICS_EXPORT_INTERVAL_S`` for Ray's export.

    .venv/bin/python load_tests/bench_thinker_stats.py     # ~35 s

One tiny Qwen3-Omni Thinker engine (hidden-state capture on, as served). The call's latency
idle; then pairs of rounds (8 requests decoding 600 tokens each), one without ``stats()``, one
asking it every 50 ms (100x the default export rate), and their throughput ratio. Writes
load_tests/results/bench_thinker_stats.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.vllm_engine import VLLMEngine
from omni_serve.models import ensure_model

RESULTS = Path(__file__).parent / "results"
STREAMS, TOKENS, PAIRS, PERIOD_S = 8, 600, 4, 0.05


async def decode(engine: VLLMEngine, tokens: int) -> int:
    """Tokens decoded by STREAMS requests of ``tokens`` each."""

    async def one(i: int) -> int:
        request = ARRequest(
            request_id=f"bench-{i}-{time.monotonic_ns()}",
            prompt_token_ids=list(range(100, 164)),
            sampling=SamplingConfig(max_tokens=tokens, temperature=0.0),
        )
        return sum([len(chunk.token_ids) async for chunk in engine.generate(request)])

    return sum(await asyncio.gather(*(one(i) for i in range(STREAMS))))


async def ask_stats(engine: VLLMEngine, stop: asyncio.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        await engine.channel_stats()
        latencies.append(time.perf_counter() - began)
        await asyncio.sleep(PERIOD_S)


async def throughput(engine: VLLMEngine, with_stats: bool) -> tuple[float, list[float]]:
    stop, latencies = asyncio.Event(), []
    asker = asyncio.create_task(ask_stats(engine, stop, latencies)) if with_stats else None
    began = time.perf_counter()
    tokens = await decode(engine, TOKENS)
    seconds = time.perf_counter() - began
    stop.set()
    if asker is not None:
        await asker
    return tokens / seconds, latencies


async def main() -> dict:
    engine = VLLMEngine(str(ensure_model("tiny-qwen3-omni")), capture_hidden=True)
    await engine.start()
    try:
        idle = []
        for _ in range(50):
            began = time.perf_counter()
            await engine.channel_stats()
            idle.append(time.perf_counter() - began)
        await decode(engine, 32)  # warm-up
        pairs, busy = [], []
        for _ in range(PAIRS):
            without, _ = await throughput(engine, with_stats=False)
            with_stats, latencies = await throughput(engine, with_stats=True)
            busy += latencies
            pairs.append(
                {
                    "tokens_per_s_without": round(without),
                    "tokens_per_s_with": round(with_stats),
                    "ratio": round(with_stats / without, 3),
                }
            )
    finally:
        await engine.shutdown()
    return {
        "stats_ms_idle_median": round(1000 * statistics.median(idle), 3),
        "stats_ms_decoding_median": round(1000 * statistics.median(busy), 3),
        "stats_ms_decoding_max": round(1000 * max(busy), 3),
        "stats_per_s": 1 / PERIOD_S,
        "pairs": pairs,
        "ratio_mean": round(statistics.mean(p["ratio"] for p in pairs), 3),
    }


if __name__ == "__main__":  # vLLM spawns its engine: the module must not run on import
    summary = asyncio.run(main())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_thinker_stats.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
