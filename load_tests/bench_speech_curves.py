"""How the served speech graph's cost grows: with concurrency, and with reply length.

    .venv/bin/python load_tests/bench_speech_curves.py concurrency   # c = 1..64, ~10 min a run
    .venv/bin/python load_tests/bench_speech_curves.py length        # 5..120 s at c=1, 4

``concurrency``: 100-frame replies (8 s of audio) at c = 1, 2, 4, ..., 64 (2c requests per
level, at least 4), until a level errors or stops gaining throughput. ``length``: replies of 5,
15, 30, 60 and 120 s at c=1 and c=4, on a pipeline whose Talker may speak that long.

Each level also reads the stages' own metrics from the ingress's ``/metrics`` before and after
it: the busy seconds of each stage's engine per wall second (the Talker's and Code2wav's;
the Thinker's are vLLM's own) say which stage saturates where a curve bends.

Writes ``docs/results/speech_<sweep>.json`` (kept), ``docs/img/speech_<sweep>.png`` and the raw
records to ``load_tests/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_speech import PROMPTS, URL, summarize  # noqa: E402
from speech_load import run_level  # noqa: E402
from stage_busy import busy_per_wall_s, stage_busy  # noqa: E402
from summary import ROOT, machine, spread, summary_path, write_summary  # noqa: E402

from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

FRAME_S = 0.08
PIPELINES = {
    "concurrency": "configs/pipelines/qwen3_omni_small.yaml",
    "length": "load_tests/configs/qwen3_omni_long_pipeline.yaml",
}


def measured_level(concurrency: int, requests: int, frames: int, cap_s: float) -> dict:
    before, start = stage_busy(URL), time.perf_counter()
    level = asyncio.run(run_level(URL, PROMPTS, concurrency, requests, 32, frames, cap_s))
    wall, after = time.perf_counter() - start, stage_busy(URL)
    row = summarize(level)
    row["busy_per_wall_s"] = busy_per_wall_s(before, after, wall)
    row["reply_s"] = frames * FRAME_S
    return {"summary": row, "raw": level}


def sweep_concurrency(args) -> list[dict]:
    rows: list[dict] = []
    for c in args.levels:
        print(f"concurrency {c}", flush=True)
        rows.append(measured_level(c, max(4, 2 * c), args.frames, args.cap_s))
        done = rows[-1]["summary"]
        gained = len(rows) < 3 or done["audio_s_per_wall_s"] > 1.05 * max(
            r["summary"]["audio_s_per_wall_s"] for r in rows[:-2]
        )
        if done["errors"] or not gained:
            print(f"stopping after c={c}: errors {done['errors']}, gaining: {gained}", flush=True)
            break
    return rows


def sweep_length(args) -> list[dict]:
    rows = []
    for seconds in args.seconds:
        for c in args.concurrency:
            print(f"{seconds} s replies at concurrency {c}", flush=True)
            frames = round(seconds / FRAME_S)
            rows.append(measured_level(c, max(2, c), frames, max(args.cap_s, 4 * seconds + 60)))
            rows[-1]["summary"]["swept"] = {"seconds": seconds, "concurrency": c}
    return rows


def figures(sweep: str, runs: list[list[dict]]) -> dict:
    """Each level's figures over the runs: median and range."""
    keys = (
        "ttfp_p50_s",
        "ttfp_p99_s",
        "e2e_p50_s",
        "rtf_mean",
        "stall_mean_s",
        "audio_s_per_wall_s",
        "errors",
    )
    out = {}
    for i, first in enumerate(runs[0]):
        s = first["summary"]
        name = (
            f"c{s['concurrency']}"
            if sweep == "concurrency"
            else f"{s['swept']['seconds']}s_c{s['concurrency']}"
        )
        levels = [run[i]["summary"] for run in runs if i < len(run)]
        row = {k: spread([lv[k] or 0.0 for lv in levels]) for k in keys}
        stages = sorted({st for lv in levels for st in lv["busy_per_wall_s"]})
        row["busy_per_wall_s"] = {
            st: spread([lv["busy_per_wall_s"].get(st, 0.0) for lv in levels]) for st in stages
        }
        out[name] = row
    return out


def plot(sweep: str, table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(table)

    def med(key: str) -> list[float]:
        return [table[n][key]["median"] for n in names]

    def err(key: str) -> list[list[float]]:
        return [
            [table[n][key]["median"] - table[n][key]["min"] for n in names],
            [table[n][key]["max"] - table[n][key]["median"] for n in names],
        ]

    x = range(len(names))
    if sweep == "concurrency":
        a.errorbar(x, med("audio_s_per_wall_s"), yerr=err("audio_s_per_wall_s"), marker="o")
        a.set_ylabel("audio s per wall s")
        b.errorbar(x, med("ttfp_p50_s"), yerr=err("ttfp_p50_s"), marker="o", label="TTFP p50")
        b.errorbar(x, med("ttfp_p99_s"), yerr=err("ttfp_p99_s"), marker="s", label="TTFP p99")
        b.set_ylabel("seconds")
        for axis in (a, b):
            axis.set_xticks(list(x), names, rotation=30)
    else:  # one line per concurrency, against the reply's length
        by_c: dict[str, list[str]] = {}
        for n in names:
            by_c.setdefault(n.split("_")[1], []).append(n)
        for c, group in by_c.items():
            seconds = [float(n.split("s_")[0]) for n in group]
            a.plot(seconds, [table[n]["rtf_mean"]["median"] for n in group], marker="o", label=c)
            b.plot(
                seconds,
                [table[n]["e2e_p50_s"]["median"] for n in group],
                marker="o",
                label=f"E2E p50, {c}",
            )
            b.plot(
                seconds,
                [table[n]["stall_mean_s"]["median"] for n in group],
                marker="s",
                linestyle="--",
                label=f"stall per reply, {c}",
            )
        a.axhline(1.0, color="grey", linestyle=":")
        a.set_ylabel("RTF (mean)")
        a.legend()
        b.set_ylabel("seconds")
        for axis in (a, b):
            axis.set_xlabel("reply length (s of audio)")
    b.legend()
    fig.suptitle(f"small-qwen3-omni served on 2 cores: {sweep} sweep")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep", choices=["concurrency", "length"])
    parser.add_argument("--levels", default="1,2,4,8,16,32,64")
    parser.add_argument("--seconds", default="5,15,30,60,120")
    parser.add_argument("--concurrency", default="1,4", help="length sweep: its levels")
    parser.add_argument("--frames", type=int, default=100, help="concurrency sweep: per reply")
    parser.add_argument("--cap-s", type=float, default=300.0, help="wall-clock cap per level")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pipeline", default=None, help="a pipeline config to serve instead")
    args = parser.parse_args()
    args.levels = [int(v) for v in args.levels.split(",")]
    args.seconds = [float(v) for v in args.seconds.split(",")]
    args.concurrency = [int(v) for v in args.concurrency.split(",")]
    pipeline = args.pipeline or PIPELINES[args.sweep]
    runs = []
    for repeat in range(args.repeats):
        server = ServeProcess("graphs.qwen3_omni:build_app", URL, (f"pipeline_config={pipeline}",))
        server.start(timeout_s=600)
        try:
            asyncio.run(run_level(URL, PROMPTS, 2, 2, 32, 20, 120))  # warm-up, not counted
            print(f"run {repeat + 1}/{args.repeats}", flush=True)
            sweep = sweep_concurrency if args.sweep == "concurrency" else sweep_length
            runs.append(sweep(args))
        finally:
            server.stop()
    table = figures(args.sweep, runs)
    name = f"speech_{args.sweep}" + ("" if args.pipeline is None else f"_{Path(pipeline).stem}")
    (ROOT / "load_tests/results").mkdir(exist_ok=True)
    (ROOT / f"load_tests/results/{name}.json").write_text(json.dumps(runs, indent=1))
    # Beside its summary: a run on another kind of machine keeps both under its own name.
    kept = summary_path(name, machine())
    image = Path("img", *kept.parent.relative_to(ROOT / "docs/results").parts, f"{name}.png")
    (ROOT / "docs" / image).parent.mkdir(parents=True, exist_ok=True)
    plot(args.sweep, table, ROOT / "docs" / image)
    sides = {
        "served": {
            "model": "small-qwen3-omni",
            "dtype": "float32",
            "cores": 2,
            "pipeline": pipeline,
        },
        "plot": image.as_posix(),
    }
    print(f"summary: {write_summary(name, {'levels': table}, sides, args.repeats)}")
    for level, row in table.items():
        busy = {s: round(v["median"], 2) for s, v in row["busy_per_wall_s"].items()}
        print(
            f"{level:>10}: {row['audio_s_per_wall_s']['median']:.2f} audio s/s, TTFP p50 "
            f"{row['ttfp_p50_s']['median']:.2f} s, RTF {row['rtf_mean']['median']:.2f}, "
            f"stall {row['stall_mean_s']['median']:.2f} s, busy {busy}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
