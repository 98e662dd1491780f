"""The GPU stages benchmark's transformers baseline runs, here on the CPU and the tiny model:
it is the one section the lent GPU machine would reach last, and a broken call there (a
helper's signature that changed) would cost a whole device run to find."""

from __future__ import annotations

import sys
from pathlib import Path

LOAD_TESTS = Path(__file__).parents[2] / "load_tests"


def test_the_transformers_baseline_speaks_and_times_itself(tiny_omni_path, monkeypatch):
    monkeypatch.syspath_prepend(str(LOAD_TESTS))  # the benchmark imports its neighbours
    sys.modules.pop("bench_gpu_stages", None)
    import bench_gpu_stages

    row = bench_gpu_stages.bench_transformers(
        tiny_omni_path, "cpu", "float32", text_tokens=4, frames=6, repeats=2
    )
    assert row["repeats"] == 2 and len(row["e2e_values_s"]) == 2
    assert row["e2e_range_s"][0] <= row["e2e_s"] <= row["e2e_range_s"][1]
    assert row["audio_s"] > 0  # it spoke


def test_the_qwen2_5_talker_step_section_times_every_kind(monkeypatch):
    """Its rows on the CPU and the tiny preset: every kind and batch timed, none failed."""
    monkeypatch.syspath_prepend(str(LOAD_TESTS))
    sys.modules.pop("gpu_talker_qwen2_5", None)
    import gpu_talker_qwen2_5

    rows = gpu_talker_qwen2_5.bench_talker_step("cpu", True, ["eager", "static"], steps=2)
    assert [r.get("error") for r in rows] == [None] * 8  # 2 dtypes x 2 kinds x 2 batches
    assert {(r["step"], r["batch"]) for r in rows} == {
        (k, b) for k in ("eager", "static") for b in (1, 2)
    }
    assert all(r["ms"] > 0 for r in rows)
