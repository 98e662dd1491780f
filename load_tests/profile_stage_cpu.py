"""Where the CPU goes at high concurrency: CPU seconds per process over one load level.

    .venv/bin/python load_tests/profile_stage_cpu.py [--concurrency 16]

Serves small-qwen3-omni as bench_speech.py does, warms up, then reads every process's CPU time
(`ps`) and the machine's busy share (/proc/stat) before and after one level of streamed speech
requests. Prints the machine's busy % and the top processes (replicas are named
ray::ServeReplica:<app>:<stage>).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_speech import PROMPTS, URL  # noqa: E402
from speech_load import run_level  # noqa: E402

from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

PIPELINE = os.environ.get("OMNI_PIPELINE", "configs/pipelines/qwen3_omni_small.yaml")


def cpu_seconds() -> dict[str, tuple[int, str]]:
    ps = ["ps", "-ww", "-eo", "pid,times,args"]
    out = subprocess.run(ps, capture_output=True, text=True).stdout
    table = {}
    for line in out.splitlines()[1:]:
        pid, seconds, *args = line.split(None, 2)
        table[pid] = (int(seconds), args[0][:60] if args else "")
    return table


def busy_and_total() -> tuple[int, int]:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # minus idle and iowait


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    server = ServeProcess("graphs.qwen3_omni:build_app", URL, (f"pipeline_config={PIPELINE}",))
    server.start(timeout_s=600)
    try:
        asyncio.run(run_level(URL, PROMPTS, 2, 2, 32, 100, 240))  # warm-up
        before, (busy0, total0), start = cpu_seconds(), busy_and_total(), time.time()
        c = args.concurrency
        asyncio.run(run_level(URL, PROMPTS, c, c, 32, 100, 240))
        after, (busy1, total1), wall = cpu_seconds(), busy_and_total(), time.time() - start
    finally:
        server.stop()
    cores = len(os.sched_getaffinity(0))
    share = (busy1 - busy0) / (total1 - total0) * 100 * cores
    print(f"concurrency {c}: wall {wall:.1f} s, machine busy {share:.0f}% of {cores * 100}%")
    used = sorted(
        ((after[p][0] - before[p][0], after[p][1]) for p in after if p in before), reverse=True
    )
    for seconds, name in used[:8]:
        print(f"{seconds:5d} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
