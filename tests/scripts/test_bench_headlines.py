"""The headline tables of docs/benchmarks.md are what the kept summaries say, and a target a
run misses reads as missed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location(
    "bench_headlines", ROOT / "scripts/bench_headlines.py"
)
headlines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headlines)


def test_the_docs_headlines_are_what_the_kept_summaries_say():
    doc = headlines.DOC.read_text()
    assert headlines.BEGIN in doc, "docs/benchmarks.md has no generated headline block"
    assert headlines.replace_block(doc, headlines.render()) == doc, (
        "docs/benchmarks.md's headlines are stale: run scripts/bench_headlines.py"
    )


def test_every_kept_summary_names_its_command_commit_and_machine():
    paths = sorted(headlines.SUMMARIES.glob("*.json"))
    assert paths
    for path in paths:
        summary = json.loads(path.read_text())
        assert summary["command"].startswith("python load_tests/"), path
        assert summary["commit"] and summary["machine"]["cores"] >= 1, path
        assert summary["repeats"] >= 1 and summary["figures"], path


def test_a_changed_figure_shows_as_a_stale_headline(tmp_path):
    shutil.copytree(headlines.SUMMARIES, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "speech.json"
    summary = json.loads(path.read_text())
    ratio = summary["figures"]["ratios"]["throughput_c16_over_best_baseline"]
    ratio.update(median=ratio["median"] + 1.0, max=ratio["max"] + 1.0)
    path.write_text(json.dumps(summary))
    doc = headlines.DOC.read_text()
    assert headlines.replace_block(doc, headlines.render(tmp_path)) != doc


def test_a_missed_target_reads_as_not_met(tmp_path):
    summary = json.loads((headlines.SUMMARIES / "speech.json").read_text())
    for key, value in (("throughput_c16_over_best_baseline", 1.5), ("rtf_c4", 1.2)):
        summary["figures"]["ratios"][key] = {"median": value, "min": value, "max": value}
    (tmp_path / "speech.json").write_text(json.dumps(summary))
    text = headlines.render(tmp_path)
    assert "1.50x, **not met** (>= 5)" in text
    assert "1.20, **not met** (<= 1)" in text
