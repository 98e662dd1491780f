"""A kept summary goes where the headline tables can render it honestly: a run on another
kind of machine than the headline's is kept beside it, never over it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

LOAD_TESTS = Path(__file__).parents[2] / "load_tests"
EPYC = {"cores": 2, "cpu": "AMD EPYC 9R14 96-Core Processor"}
XEON = {"cores": 2, "cpu": "Intel(R) Xeon(R) Processor"}


@pytest.fixture
def summary(monkeypatch):
    monkeypatch.syspath_prepend(str(LOAD_TESTS))
    monkeypatch.delenv("OMNI_BENCH_HEADLINE", raising=False)
    sys.modules.pop("summary", None)
    import summary

    return summary


def _keep(root: Path, name: str, machine: dict) -> None:
    (root / f"{name}.json").write_text(json.dumps({"name": name, "machine": machine}))


def test_a_run_on_another_cpu_is_kept_under_that_machine(summary, tmp_path):
    _keep(tmp_path, "speech", EPYC)
    path = summary.summary_path("speech", XEON, tmp_path)
    assert path == tmp_path / "machines" / "intel-xeon-processor-2-cores" / "speech.json"
    # The same CPU with other cores is another kind of machine too.
    other = summary.summary_path("speech", {**EPYC, "cores": 4}, tmp_path)
    assert other.parent.name == "amd-epyc-9r14-96-core-processor-4-cores"


def test_the_headlines_machine_or_a_first_run_or_the_override_replace_the_headline(
    summary, tmp_path, monkeypatch
):
    _keep(tmp_path, "speech", EPYC)
    assert summary.summary_path("speech", dict(EPYC), tmp_path) == tmp_path / "speech.json"
    assert summary.summary_path("image", XEON, tmp_path) == tmp_path / "image.json"
    monkeypatch.setenv("OMNI_BENCH_HEADLINE", "1")
    assert summary.summary_path("speech", XEON, tmp_path) == tmp_path / "speech.json"


def test_gpus_are_told_apart_by_the_gpu(summary, tmp_path):
    _keep(tmp_path, "gpu_stages", {"gpu": "NVIDIA H200", "cpu": "x", "cores": 16})
    same = {"gpu": "NVIDIA H200", "cpu": "y", "cores": 8}
    assert summary.summary_path("gpu_stages", same, tmp_path) == tmp_path / "gpu_stages.json"
    h100 = summary.summary_path("gpu_stages", {"gpu": "NVIDIA H100 80GB HBM3"}, tmp_path)
    assert h100.parent.name == "nvidia-h100-80gb-hbm3"


def test_write_summary_keeps_another_machines_run_beside_the_headline(
    summary, tmp_path, monkeypatch
):
    monkeypatch.setattr(summary, "SUMMARIES", tmp_path)
    _keep(tmp_path, "speech", EPYC)
    measured_on = {"command": "python load_tests/bench_speech.py", "commit": "c", "machine": XEON}
    path = summary.write_summary("speech", {"x": 1}, {}, 1, measured_on)
    assert path.parent.parent == tmp_path / "machines"
    assert json.loads(path.read_text())["figures"] == {"x": 1}
    assert json.loads((tmp_path / "speech.json").read_text())["machine"] == EPYC  # untouched
