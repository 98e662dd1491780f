"""Keeps a ``bench_gpu_stages.py`` run as ``docs/results/gpu_stages.json``.

The benchmark runs on a lent GPU machine and its raw JSON comes back through ``$OUT``; this
turns that file into the kept summary the headline table is generated from, recording the
run's own command, commit and device (not this machine's):

    python load_tests/gpu_stages_summary.py RAW.json [--commit SHA]

``--commit`` names the tree the run used where the raw file's is wrong (a lent machine's copy
of ``.git`` can be older than the tree sent with the call).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summary import spread, write_summary  # noqa: E402

SIDES = {
    "ours": "the Talker's decode step (Talker forward, 15 code-predictor passes, sampling on "
    "the device) and Code2wav, bare torch, one process",
    "transformers": "Qwen3OmniMoeForConditionalGeneration.generate: 32 text tokens, then "
    "the Talker and Code2wav for the frames",
}


def figures_of(raw: dict) -> dict:
    """Each figure as a median with its range: a graphed step row over its timed windows of
    20 steps (3 since run 2; one before), an end-to-end row one reply loop, transformers' E2E
    over its repeats."""
    steps = raw.get("talker_step", []) + raw.get("talker_step_compiled", [])
    figures: dict = {"talker_step_ms": {}, "end_to_end": {}, "transformers_e2e_s": {}}
    for row in steps:
        key = f"{row['dtype']}/{row['step']}/b{row['batch']}"
        windows = row.get("ms_windows") or [row["ms"]] if "ms" in row else None
        figures["talker_step_ms"][key] = spread(windows) if windows else None
    for row in raw.get("end_to_end", []):
        key = f"{row['dtype']}/{row['step']}/b{row['batch']}"
        figures["end_to_end"][key] = {
            "wall_s": spread([row["wall_s"]]),
            "audio_s": row["audio_s"],
            "audio_s_per_s": spread([row["audio_s_per_s"]]),
            "frames": row["frames"],
        }
    for row in raw.get("transformers", []):
        values = row.get("e2e_values_s")
        if values is None and row["repeats"] == 3:  # min, median, max are the three runs
            values = [row["e2e_range_s"][0], row["e2e_s"], row["e2e_range_s"][1]]
        figures["transformers_e2e_s"][row["dtype"]] = {
            **spread(values or [row["e2e_s"]]),
            "audio_s": row["audio_s"],
        }
    figures["code2wav_ms_per_25_frames"] = {
        f"{row['dtype']}/b{row.get('batch', 1)}": spread([row["ms_per_25_frames"]])
        for row in raw.get("code2wav", [])
    }
    figures["kernels_per_step"] = {
        f"{row['dtype']}/b{row['batch']}": {
            "kernels": row["kernels"],
            "gpu_busy_ms": row["gpu_busy_ms"],
        }
        for row in raw.get("kernels", [])
    }
    return figures


def keep(raw: dict, commit: str | None = None) -> Path:
    machine = raw.get("machine") or {"gpu": raw["device"], "torch": raw["torch"]}
    command = "python " + raw["command"].split(" ", 1)[1]  # python3 or python: the same
    measured_on = {
        "command": command,
        "commit": commit or raw["commit"],
        "machine": {**machine, "gpu": raw["device"]},
    }
    sides = {**SIDES, "model": raw["model"], "torch_threads": raw["threads"]}
    return write_summary("gpu_stages", figures_of(raw), sides, 1, measured_on)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw", type=Path, help="bench_gpu_stages.json from the GPU run")
    parser.add_argument("--commit", help="the tree the run used, if the raw file's is wrong")
    args = parser.parse_args()
    print(keep(json.loads(args.raw.read_text()), args.commit))


if __name__ == "__main__":
    main()
