"""Prefill saved by loading a prefix's KV blocks from another engine (issue 5's KV proof).

    .venv/bin/python load_tests/bench_kv_prefix.py [--model small-qwen3-omni] [--channel auto]

Two vLLM engines of one model with the ChannelKVConnector, in one run. For each prompt length
and round, on fresh random prompts (no local prefix-cache hit anywhere):
- ``export``: engine A (no prefix cache) answers a prompt with ``omni_kv_export``
  (max_tokens=1), vs ``plain_a``: the same prompt again without it (what exporting costs A);
- ``import``: engine B answers that prompt plus an 8-token new turn, loading the prefix, vs
  ``plain_b``: B answers another fresh prompt of the same length from scratch.
Time to the first (only) token is the prefill. Writes load_tests/results/bench_kv_prefix.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine (default: most of RAM)
RESULTS = Path(__file__).parent / "results"
LENGTHS = (512, 1536, 3584)
ROUNDS = 5


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="small-qwen3-omni")
    parser.add_argument("--channel", default="auto")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    from omni_serve.engines.ar.vllm_engine import DEFAULT_ENGINE_ARGS, channel_kv_transfer_config
    from omni_serve.models.registry import resolve_model

    path = str(resolve_model(args.model))
    kv = channel_kv_transfer_config(args.channel)
    engine_args = {k: v for k, v in DEFAULT_ENGINE_ARGS.items() if k != "limit_mm_per_prompt"}
    # A without a prefix cache, so it can answer the same prompt twice (with and without the
    # export) at the same cost; B with one, as served.
    engines = [
        LLM(path, kv_transfer_config=kv, enable_prefix_caching=False, **engine_args),
        LLM(path, kv_transfer_config=kv, **engine_args),
    ]
    vocab = engines[0].get_tokenizer().vocab_size
    rng = random.Random(0)

    def fresh(length: int) -> list[int]:
        return [rng.randrange(10, min(vocab, 250)) for _ in range(length)]

    def timed(engine, prompt: list[int], kv_params: dict | None = None):
        extra = {"kv_transfer_params": kv_params} if kv_params else None
        params = SamplingParams(max_tokens=1, temperature=0, extra_args=extra)
        start = time.perf_counter()
        out = engine.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
        return time.perf_counter() - start, out

    a, b = engines
    timed(a, fresh(64))  # warm-up
    timed(b, fresh(64))
    rows = []
    for length in LENGTHS:
        times: dict[str, list[float]] = {"export": [], "plain_a": [], "import": [], "plain_b": []}
        loaded = []
        for _ in range(ROUNDS):
            prompt = fresh(length)
            seconds, out = timed(a, prompt, {"omni_kv_export": True})
            times["export"].append(seconds)
            times["plain_a"].append(timed(a, prompt)[0])
            turn = [*prompt, *fresh(8)]
            seconds, out_b = timed(b, turn, {"omni_kv": out.kv_transfer_params["omni_kv"]})
            times["import"].append(seconds)
            loaded.append(out_b.num_cached_tokens)
            times["plain_b"].append(timed(b, fresh(length + 8))[0])
        row = {"prompt_tokens": length, "loaded_tokens": statistics.median(loaded)}
        row.update({f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()})
        row["prefill_saved_ms"] = row["plain_b_ms"] - row["import_ms"]
        row["import_over_plain"] = row["import_ms"] / row["plain_b_ms"]
        row["export_overhead_ms"] = row["export_ms"] - row["plain_a_ms"]
        rows.append(row)
        print(
            f"{length:5d} tokens: plain {row['plain_b_ms']:7.1f} ms, with the prefix loaded "
            f"{row['import_ms']:7.1f} ms ({row['import_over_plain']:.2f}x, "
            f"{row['loaded_tokens']:.0f} tokens loaded); exporting costs A "
            f"{row['export_overhead_ms']:+.1f} ms",
            flush=True,
        )
    for engine in engines:
        engine.llm_engine.engine_core.shutdown()
    RESULTS.mkdir(exist_ok=True)
    result = {"model": args.model, "channel": args.channel, "rounds": ROUNDS, "rows": rows}
    (RESULTS / "bench_kv_prefix.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
