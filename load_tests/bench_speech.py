"""Speech serving benchmark: TTFP, E2E, RTF, throughput at concurrency 1/4/16, against
transformers' generate (one request after another) on the same model and prompts, in one run.

    .venv/bin/python load_tests/bench_speech.py            # small-qwen3-omni, ~10 min
    .venv/bin/python load_tests/bench_speech.py --quick    # tiny model, a smoke run
    .venv/bin/python load_tests/bench_speech.py --family qwen2_5_omni   # small-qwen2-5-omni

Writes load_tests/results/bench_speech.json and .png and prints a table. Targets (issue 4, on
small-qwen3-omni): TTFP at c=1 <= 0.1x the baseline's E2E; throughput at c=16 >= 5x the
baseline's; RTF < 1 at c=4. One more level at c=1 sends a long stop string that the replies
never begin (``ttfp_c1_with_stop_over_without``): speech should start as early as without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from speech_baseline import run_baselines  # noqa: E402
from speech_load import run_level  # noqa: E402
from summary import spread, write_summary  # noqa: E402

from omni_serve.models import ensure_model  # noqa: E402
from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

URL = "http://127.0.0.1:8000"
RESULTS = Path(__file__).parent / "results"
# Longer than the replies (42 bytes): a Talker that waited as many tokens as a stop string has
# bytes would start only once the reply ended.
NEVER_SAID = ["\x07 never said \x07" * 3]
PROMPTS = [
    "Tell me about the weather today.",
    "Say hello to everyone in the room.",
    "What is the capital of France?",
    "Describe a quiet morning by the sea.",
    "Give me one tip for learning a language.",
    "Count from one to five.",
    "What makes a good cup of tea?",
    "Read this sentence out loud, please.",
]


# Per family: the served app, its pipelines, its model name, and codec frames per audio second.
FAMILIES = {
    "qwen3_omni": {
        "graph": "graphs.qwen3_omni:build_app",
        "presets": ("tiny-qwen3-omni", "small-qwen3-omni"),
        "pipeline": "configs/pipelines/qwen3_omni_{size}.yaml",
        "model": "qwen3-omni",
        "frames_per_s": 12.5,
        "summary": "speech",
    },
    "qwen2_5_omni": {
        "graph": "graphs.qwen2_5_omni:build_app",
        "presets": ("tiny-qwen2-5-omni", "small-qwen2-5-omni"),
        "pipeline": "configs/pipelines/qwen2_5_omni_{size}.yaml",
        "model": "qwen2.5-omni",
        "frames_per_s": 50.0,
        "summary": "speech_qwen2_5_omni",
    },
}


def summarize(level: dict) -> dict:
    records = [r for r in level["records"] if r["ok"]]
    errors = len(level["records"]) - len(records)
    ttfp = sorted(r["ttfp_s"] for r in records if r["ttfp_s"] is not None)
    e2e = sorted(r["e2e_s"] for r in records)
    audio = sum(r["audio_s"] for r in records)
    timings = [r.get("timings", {}) for r in records]  # the baseline's records have none

    def pct(values: list[float], q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    return {
        "concurrency": level["concurrency"],
        "requests": len(level["records"]),
        "errors": errors,
        "ttfp_p50_s": pct(ttfp, 0.5),
        "ttfp_p99_s": pct(ttfp, 0.99),
        "e2e_p50_s": pct(e2e, 0.5),
        "rtf_p50": statistics.median(r["e2e_s"] / r["audio_s"] for r in records if r["audio_s"])
        if records
        else None,
        "rtf_mean": statistics.fmean(r["e2e_s"] / r["audio_s"] for r in records if r["audio_s"])
        if records
        else None,
        "stall_mean_s": statistics.fmean(r.get("stall_s", 0.0) for r in records)
        if records
        else None,
        "audio_s_per_wall_s": audio / level["wall_s"] if level["wall_s"] else 0.0,
        "wall_s": level["wall_s"],
        # where the time goes, as the server saw it (p50 of each of its timings)
        "server_timings_p50": {
            key: statistics.median(t[key] for t in timings if key in t)
            for key in sorted({k for t in timings for k in t})
        },
    }


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = summary["levels"]
    base = summary["baseline"]
    names = [f"c={lv['concurrency']}" for lv in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(
        ["baseline E2E"] + [f"TTFP {n}" for n in names],
        [base["e2e_p50_s"]] + [lv["ttfp_p50_s"] or 0 for lv in levels],
    )
    a.set_ylabel("seconds (p50)")
    a.set_title("time to first audio vs baseline")
    b.bar(
        ["baseline"] + names,
        [base["audio_s_per_wall_s"]] + [lv["audio_s_per_wall_s"] for lv in levels],
    )
    b.set_ylabel("audio seconds per wall second")
    b.set_title("throughput")
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny model, few requests")
    parser.add_argument("--text-tokens", type=int, default=32)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3_omni")
    parser.add_argument(
        "--frames", type=int, default=None, help="Talker tokens (default: 8 s of audio)"
    )
    parser.add_argument("--cap-s", type=float, default=240.0, help="wall-clock cap per level")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every level and baseline")
    args = parser.parse_args()
    family = FAMILIES[args.family]
    args.frames = args.frames or int(8 * family["frames_per_s"])
    preset = family["presets"][0 if args.quick else 1]
    pipeline = family["pipeline"].format(size=preset.split("-")[0])
    plan = [(1, 2), (4, 4), (16, 16)] if args.quick else [(1, 4), (4, 8), (16, 16)]
    baseline_requests = 2 if args.quick else 4
    model_dir = ensure_model(preset)
    cores = sorted(os.sched_getaffinity(0))  # the served graph's stages run on all of them

    runs = []
    for repeat in range(args.repeats):
        print(
            f"repeat {repeat + 1}/{args.repeats}: baselines (transformers generate, "
            f"{baseline_requests} requests per process) on cores {cores}"
        )
        baselines = run_baselines(
            model_dir, PROMPTS, baseline_requests, args.text_tokens, args.frames, cores, args.family
        )
        runs.append({"baselines": baselines, **serve_levels(args, family, pipeline, plan)})
    summary = summarize_runs(runs, preset, args, pipeline, family["frames_per_s"])
    RESULTS.mkdir(exist_ok=True)
    stem = "bench_" + family["summary"] + ("_quick" if args.quick else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({**summary, "raw": runs}, indent=1))
    plot(summary["last_run"], RESULTS / f"{stem}.png")
    if not args.quick:
        kept = write_summary(family["summary"], summary["figures"], summary["sides"], args.repeats)
        print(f"summary: {kept}")
    print_table(summary)
    return 0


def serve_levels(args, family: dict, pipeline: str, plan: list[tuple[int, int]]) -> dict:
    """One run of the served graph: a fresh server, a warm-up, then every level."""
    server = ServeProcess(family["graph"], URL, (f"pipeline_config={pipeline}",))
    started = time.perf_counter()
    server.start(timeout_s=600)
    print(f"server ready in {time.perf_counter() - started:.0f}s", flush=True)
    try:

        def level(concurrency: int, requests: int, stop: list[str] | None = None) -> dict:
            load = run_level(
                URL,
                PROMPTS,
                concurrency,
                requests,
                args.text_tokens,
                args.frames,
                args.cap_s,
                stop,
                family["model"],
            )
            return asyncio.run(load)

        level(2, 2)  # warm-up, not counted
        levels = []
        for concurrency, requests in plan:
            print(f"load: concurrency {concurrency}, {requests} requests", flush=True)
            levels.append(level(concurrency, requests))
        print(f"load: concurrency 1, {plan[0][1]} requests with a stop string", flush=True)
        with_stop = level(1, plan[0][1], NEVER_SAID)
    finally:
        server.stop()
    return {"levels": levels, "c1_with_stop": with_stop}


def summarize_runs(runs: list[dict], preset: str, args, pipeline: str, frames_per_s: float) -> dict:
    """Per run: every level and baseline shape summarized, and the ratios against the best
    same-core baseline of that run. Over runs: each figure's median and range."""
    per_run = []
    for run in runs:
        shapes = {name: summarize(b) for name, b in run["baselines"].items()}
        best = max(shapes, key=lambda name: shapes[name]["audio_s_per_wall_s"])
        fastest_e2e = min(row["e2e_p50_s"] for row in shapes.values())
        levels = {lv["concurrency"]: summarize(lv) for lv in run["levels"]}
        stop = summarize(run["c1_with_stop"])
        per_run.append(
            {
                "baselines": shapes,
                "best_baseline": best,
                "levels": levels,
                "c1_with_stop": stop,
                "ratios": {
                    "ttfp_c1_over_fastest_baseline_e2e": levels[1]["ttfp_p50_s"] / fastest_e2e,
                    "throughput_c16_over_best_baseline": levels[16]["audio_s_per_wall_s"]
                    / shapes[best]["audio_s_per_wall_s"],
                    "throughput_c16_over_1x1": levels[16]["audio_s_per_wall_s"]
                    / shapes["1x1"]["audio_s_per_wall_s"],
                    "rtf_c4": levels[4]["rtf_p50"],
                    "ttfp_c1_with_stop_over_without": stop["ttfp_p50_s"] / levels[1]["ttfp_p50_s"],
                },
            }
        )
    keys = (
        "ttfp_p50_s",
        "ttfp_p99_s",
        "e2e_p50_s",
        "rtf_p50",
        "rtf_mean",
        "stall_mean_s",
        "audio_s_per_wall_s",
        "errors",
    )
    figures: dict = {"served": {}, "baselines": {}, "ratios": {}}
    for c in per_run[0]["levels"]:
        figures["served"][f"c{c}"] = {
            k: spread([r["levels"][c][k] or 0 for r in per_run]) for k in keys
        }
    for name in per_run[0]["baselines"]:
        figures["baselines"][name] = {
            k: spread([r["baselines"][name][k] for r in per_run])
            for k in ("e2e_p50_s", "audio_s_per_wall_s")
        }
    for key in per_run[0]["ratios"]:
        figures["ratios"][key] = spread([r["ratios"][key] for r in per_run])
    figures["best_baseline"] = [r["best_baseline"] for r in per_run]
    sides = {
        "served": {
            "model": preset,
            "dtype": "float32",
            "cores": len(os.sched_getaffinity(0)),
            "pipeline": f"{pipeline} (Thinker pinned to core 0, Talker to core 1, "
            "the rest unpinned)",
        },
        "baselines": {
            name: {
                "model": preset,
                "dtype": "float32",
                "processes": b["processes"],
                "threads": b["threads"],
                "cores": b["cores"],
            }
            for name, b in runs[0]["baselines"].items()
        },
        "reply": {
            "text_tokens": args.text_tokens,
            "talker_frames": args.frames,
            "audio_s": args.frames / frames_per_s,
        },
    }
    return {
        "figures": figures,
        "sides": sides,
        "per_run": per_run,
        "last_run": {
            "baseline": per_run[-1]["baselines"][per_run[-1]["best_baseline"]],
            "levels": list(per_run[-1]["levels"].values()),
        },
    }


def print_table(summary: dict) -> None:
    figures = summary["figures"]
    print(
        f"\n{'':14}{'TTFP p50':>19}{'E2E p50':>19}{'RTF mean':>19}{'audio s/s':>19}"
        f"{'stall/reply':>19}"
    )

    def cell(f: dict | None) -> str:
        return f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})" if f else "-"

    for name, row in figures["baselines"].items():
        print(
            f"{'tf ' + name:14}{'':>19}{cell(row['e2e_p50_s']):>19}{'':>19}"
            f"{cell(row['audio_s_per_wall_s']):>19}"
        )
    for name, row in figures["served"].items():
        print(
            f"{'served ' + name:14}{cell(row['ttfp_p50_s']):>19}{cell(row['e2e_p50_s']):>19}"
            f"{cell(row['rtf_mean']):>19}{cell(row['audio_s_per_wall_s']):>19}"
            f"{cell(row['stall_mean_s']):>19}"
        )
    print("ratios:", json.dumps({k: cell(v) for k, v in figures["ratios"].items()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
