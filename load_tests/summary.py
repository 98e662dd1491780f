"""What every benchmark keeps: a small summary JSON under version control.

Raw results (every request's record, plots) go to ``load_tests/results/`` (git-ignored); the
summary a number in the docs is quoted from goes to ``docs/results/<name>.json`` with the
command that made it, the commit, the machine, and each figure as a median with its range
over the repeats. ``scripts/bench_headlines.py`` builds the headline tables of
docs/benchmarks.md from these files only.

A headline table compares sides measured on one kind of machine. So a run on another kind of
machine than the kept summary's (another CPU model or core count, or another GPU) does not
replace it: it is kept in ``docs/results/machines/<that machine>/<name>.json``, which the
generator renders as that machine's own tables. ``OMNI_BENCH_HEADLINE=1`` makes a run the
headline regardless (the way to move the headlines to a new kind of machine).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
SUMMARIES = ROOT / "docs" / "results"


def spread(values: list[float]) -> dict[str, Any]:
    """A figure over repeats: the median, the range and every value."""
    values = [float(v) for v in values]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def machine() -> dict[str, Any]:
    """Cores this process may run on, the CPU model, memory and the torch build."""
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info = {"cores": len(os.sched_getaffinity(0)), "cpu": model, "memory_gib": round(memory, 1)}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return info


def git_commit() -> str:
    try:
        out = subprocess.check_output(
            ["git", "rev-parse", "--short", "HEAD"], text=True, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        dirty = subprocess.run(
            [
                "git",
                "diff",
                "--quiet",
                "HEAD",
                "--",
                "omni_serve",
                "deployments",
                "graphs",
                "configs",
                "load_tests",
            ],
            cwd=ROOT,
        ).returncode
        return out.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_kind(info: dict[str, Any]) -> str:
    """What makes two runs' figures comparable: the GPU if there is one, else the CPU model
    and its core count."""
    return info.get("gpu") or f"{info.get('cpu', 'unknown cpu')}, {info.get('cores', '?')} cores"


def machine_slug(info: dict[str, Any]) -> str:
    """``Intel(R) Xeon(R) Processor``, 2 cores -> ``intel-xeon-processor-2-cores``."""
    words = re.sub(r"\((R|TM)\)", "", machine_kind(info), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")


def summary_path(name: str, info: dict[str, Any], root: Path | None = None) -> Path:
    """Where a run on ``info``'s machine keeps summary ``name`` (see the module's docstring)."""
    root = SUMMARIES if root is None else root
    headline = root / f"{name}.json"
    if os.environ.get("OMNI_BENCH_HEADLINE") == "1" or not headline.exists():
        return headline
    kept = json.loads(headline.read_text()).get("machine", {})
    if machine_kind(kept) == machine_kind(info):
        return headline
    return root / "machines" / machine_slug(info) / f"{name}.json"


# The commit the benchmark started on (a run takes minutes; HEAD may move meanwhile).
STARTED_AT = git_commit()


def write_summary(
    name: str,
    figures: dict[str, Any],
    sides: dict[str, Any],
    repeats: int,
    measured_on: dict[str, Any] | None = None,
) -> Path:
    """``figures``: what the headline quotes (medians with ranges); ``sides``: what each side
    of a comparison used (cores, threads, processes, dtype). ``measured_on``: the command,
    commit and machine of a run made elsewhere (a lent GPU machine, whose raw results are
    kept here afterwards); by default this process's."""
    here = {"command": "python " + shlex.join(sys.argv), "commit": STARTED_AT, "machine": machine()}
    summary = {
        "name": name,
        **(measured_on or here),
        "repeats": repeats,
        "sides": sides,
        "figures": figures,
    }
    path = summary_path(name, summary["machine"])
    if path.parent.parent.name == "machines":
        print(f"this machine is not the headline's kind: keeping the summary as {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path
