"""Resumed turns from each tier of the KV store against recomputing them (issue 40).

    .venv/bin/python load_tests/bench_session_tiers.py [--repeats 3] [--sessions-per-length 3]

The Thinker stage as served (``ThinkerDeployment`` on the small model's vLLM engine, audio
rows from the encoder stage spliced into the prompt) and the store the session store replica
runs (``TieredPrefixStore``), in one process, on the cores the small pipeline gives the
Thinker. Per repeat, on fresh random prompts:

1. Sessions of 2k, 4k and 8k tokens (interleaved; each with a 150-row audio clip near its
   start) take their first turn on replica A, which exports its KV into the store. The host
   tier holds far less than they add up to, so the older ones go to disk, and the disk
   budget is smaller than the rest, so the oldest leave it too.
2. The pages are dropped from the OS page cache (so a disk load reads the device). Newest
   first, each session's second turn (its first turn plus 16 new tokens) goes to
   replica B: ``resumed`` asks the store (whichever tier has it) and loads what it gets;
   ``recompute`` is the same prompt, as a new session, computed whole. B has no prefix cache
   of its own, so every recompute computes and every load is the store's.

Time to first token (max_tokens 1: the prefill, the store's lookup and read, the load, and
the export every session turn makes) is the figure. Writes load_tests/results/
bench_session_tiers.json and the summary docs/results/session_tiers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB per engine: two 8k prompts at once
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from summary import spread, write_summary  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CONFIG = Path(__file__).parents[1] / "configs/pipelines/qwen3_omni_small.yaml"
LENGTHS = (2048, 4096, 8192)
CLIP_ROWS = 150
NEW_TOKENS = 16
HOST_MAX_BYTES = 256 << 20
DISK_MAX_BYTES = 512 << 20


async def _replica(pipeline: dict[str, Any], prefix_cache: bool):
    from deployments.thinker import ThinkerDeployment

    pipeline = json.loads(json.dumps(pipeline))
    for stage in pipeline["stages"]:
        if stage["name"] == "thinker":
            stage["engine"]["args"]["max_model_len"] = max(LENGTHS) + 512
            stage["engine"]["args"]["enable_prefix_caching"] = prefix_cache
    cls = ThinkerDeployment.func_or_class
    replica = object.__new__(cls)
    await cls.__init__(replica, pipeline)
    replica._watchdog.cancel()  # it would exit this process when the engine stops
    return replica


async def _first_token(replica, request) -> tuple[float, int, str | None]:
    """Seconds to the first chunk, the cached tokens it reports, and the turn's export."""
    from omni_serve.models.thinker_talker.messages import from_wire

    start = time.perf_counter()
    first, chunks = None, []
    async for wire in replica.generate(request):
        first = first or time.perf_counter() - start
        chunks.append(from_wire(wire))
    return first, chunks[0].num_cached_tokens, chunks[-1].session_kv


def _evict_from_page_cache(pages: Path) -> None:
    """Pages just written sit in the OS page cache, and reading them there measures memory,
    not the disk: write them out and drop them, so a load reads the device."""
    for path in pages.glob("*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _session(rng: random.Random, length: int, audio_token: int, hidden: int, seed: int):
    ids = [rng.randrange(10, 250) for _ in range(length - CLIP_ROWS)]
    prompt = [*ids[:100], *[audio_token] * CLIP_ROWS, *ids[100:]]
    rows = torch.randn(CLIP_ROWS, hidden, generator=torch.Generator().manual_seed(seed))
    return prompt, rows


async def one_repeat(
    replicas, repeat: int, pages: Path, lengths: tuple[int, ...], per_length: int
) -> list[dict[str, Any]]:
    from omni_serve.config.kv_store import KVStoreConfig
    from omni_serve.engines.ar.base import SamplingConfig
    from omni_serve.kv_store.content_key import PromptContent, media_digest
    from omni_serve.kv_store.tiered_store import TieredPrefixStore
    from omni_serve.models.thinker_talker.messages import ThinkerRequest
    from omni_serve.transport import make_channel

    first, second = replicas
    config = KVStoreConfig(
        host_max_bytes=HOST_MAX_BYTES,
        disk_path=str(pages),
        disk_max_bytes=DISK_MAX_BYTES,
        prefill_tokens_per_s=1.0,  # load whatever is kept: each tier is measured
    )
    store = TieredPrefixStore(config, f"bench-{repeat}", make_channel("shared_memory"))
    rng, greedy = random.Random(repeat), SamplingConfig(max_tokens=1, temperature=0.0)
    audio, hidden = first.audio_token_id, first.embed_tokens.shape[1]

    def request(rid: str, prompt: list[int], rows, session: str, kv: str | None = None):
        clip = make_channel("inline", 1 << 30).put(rows.clone())
        return ThinkerRequest(
            rid, prompt, greedy, session_id=session, session_kv=kv, **{"audio_rows": clip}
        )

    sessions, peaks = [], {"host": 0, "disk": 0}
    for i, length in enumerate([n for _ in range(per_length) for n in lengths]):
        prompt, rows = _session(rng, length, audio, hidden, seed=1000 * repeat + i)
        content = PromptContent(prompt, [(100, media_digest(rows))])
        sid = f"r{repeat}-s{i}"
        _, _, exported = await _first_token(first, request(f"{sid}-t1", prompt, rows, sid))
        await store.keep(sid, exported, content)
        sessions.append((sid, length, prompt, rows))
        stats = store.stats()
        peaks["host"] = max(peaks["host"], stats["host"]["bytes"])
        peaks["disk"] = max(peaks["disk"], stats["disk"]["bytes"])
    store.disk.flush()
    _evict_from_page_cache(store.disk.dir)

    records = []
    for sid, _length, prompt, rows in reversed(sessions):
        turn_two = [*prompt, *(rng.randrange(10, 250) for _ in range(NEW_TOKENS))]
        before = store.stats()
        start = time.perf_counter()
        offered = await store.find(sid, PromptContent(turn_two, [(100, media_digest(rows))]))
        found_s = time.perf_counter() - start
        after = store.stats()
        tier = next((t for t in ("host", "disk") if after[t]["hits"] > before[t]["hits"]), "miss")
        ttft, cached, kv = await _first_token(
            second, request(f"{sid}-t2", turn_two, rows, sid, offered)
        )
        await store.keep(sid, kv, PromptContent(turn_two, [(100, media_digest(rows))]))
        cold, cold_cached, cold_kv = await _first_token(
            second, request(f"{sid}-cold", turn_two, rows, f"{sid}-cold")
        )
        from omni_serve.transport.session_prefixes import free_prefix

        free_prefix(cold_kv)
        stats = store.stats()
        peaks["host"] = max(peaks["host"], stats["host"]["bytes"])
        peaks["disk"] = max(peaks["disk"], stats["disk"]["bytes"])
        records.append(
            {
                "repeat": repeat,
                "session": sid,
                "tokens": len(turn_two),
                "tier": tier,
                "resumed_ttft_s": found_s + ttft,
                "lookup_s": found_s,
                "cached_tokens": cached,
                "recompute_ttft_s": cold,
                "recompute_cached_tokens": cold_cached,
            }
        )
        print(json.dumps(records[-1]), flush=True)
    final = store.stats()
    records.append({"repeat": repeat, "peaks": peaks, "store": final})
    store.clear()
    return records


def summarize(records: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    turns = [r for r in records if "tier" in r]
    figures: dict[str, Any] = {}
    for length in LENGTHS:
        tokens = length + NEW_TOKENS
        for tier in ("host", "disk"):
            ratios = []
            for repeat in range(repeats):
                mine = [
                    r
                    for r in turns
                    if r["repeat"] == repeat and r["tokens"] == tokens and r["tier"] == tier
                ]
                if mine:
                    ratios.append(
                        statistics.median(r["recompute_ttft_s"] for r in mine)
                        / statistics.median(r["resumed_ttft_s"] for r in mine)
                    )
            if ratios:
                figures[f"speedup_{tier}_{length // 1024}k"] = spread(ratios)
        for side in ("resumed", "recompute"):
            per_repeat = [
                statistics.median(
                    r[f"{side}_ttft_s"]
                    for r in turns
                    if r["repeat"] == repeat and r["tokens"] == tokens
                )
                for repeat in range(repeats)
            ]
            figures[f"{side}_ttft_s_{length // 1024}k"] = spread(per_repeat)
    for tier in ("host", "disk", "miss"):
        figures[f"hit_rate_{tier}"] = spread(
            [
                sum(r["tier"] == tier for r in turns if r["repeat"] == k)
                / max(1, sum(r["repeat"] == k for r in turns))
                for k in range(repeats)
            ]
        )
    peaks = [r["peaks"] for r in records if "peaks" in r]
    figures["peak_host_bytes"] = spread([p["host"] for p in peaks])
    figures["peak_disk_bytes"] = spread([p["disk"] for p in peaks])
    figures["budgets"] = {"host_max_bytes": HOST_MAX_BYTES, "disk_max_bytes": DISK_MAX_BYTES}
    figures["budgets_kept"] = all(
        p["host"] <= HOST_MAX_BYTES and p["disk"] <= DISK_MAX_BYTES for p in peaks
    )
    recompute = [r for r in turns if r["recompute_cached_tokens"] == 0]
    figures["prefill_tokens_per_s"] = spread(
        [r["tokens"] / r["recompute_ttft_s"] for r in recompute]
    )
    stores = [r["store"] for r in records if "store" in r]
    figures["disk_read_bytes_per_s"] = spread([s["disk"]["read_bytes_per_s"] for s in stores])
    return figures


async def main_async() -> int:
    from omni_serve.config.loading import load_pipeline_config
    from omni_serve.models import ensure_model

    pipeline = load_pipeline_config(CONFIG).model_dump()
    pipeline["model"] = str(ensure_model(pipeline["model"]))
    for edge in pipeline["edges"]:
        if edge["payload"] == "session_kv":
            edge["channel"]["backend"] = "shared_memory"
    replicas = (await _replica(pipeline, True), await _replica(pipeline, False))
    records = []
    try:
        # Not measured: the first load, export and prefill of each engine pay one-time costs
        # (its first shared-memory segments, kernels' first runs).
        with tempfile.TemporaryDirectory(prefix="bench-kv-pages-") as pages:
            await one_repeat(replicas, -1, Path(pages), (1024,), 1)
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="bench-kv-pages-") as pages:
                per = args.sessions_per_length
                records += await one_repeat(replicas, repeat, Path(pages), LENGTHS, per)
    finally:
        for replica in replicas:
            await replica.engine.shutdown()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_session_tiers.json").write_text(json.dumps(records, indent=1))
    figures = summarize(records, args.repeats)
    figures["targets"] = {
        "disk_8k_speedup_at_least": 3.0,
        "host_8k_speedup_at_least": 10.0,
        "met_disk": figures.get("speedup_disk_8k", {}).get("median", 0) >= 3.0,
        "met_host": figures.get("speedup_host_8k", {}).get("median", 0) >= 10.0,
        "met_budgets": figures["budgets_kept"],
    }
    sides = {
        "resumed": "the store's lookup and read + the Thinker's load, on replica B (1 core)",
        "recompute": "the same prompt computed whole on replica B (no prefix cache), 1 core",
        "model": "small-qwen3-omni, float32, vLLM CPU block 128",
    }
    path = write_summary("session_tiers", figures, sides, args.repeats)
    print(json.dumps(figures, indent=1))
    print(f"summary: {path}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sessions-per-length", type=int, default=3)
    args = parser.parse_args()
    sys.exit(asyncio.run(main_async()))
