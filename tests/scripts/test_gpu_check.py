"""The GPU check runs on the lent machine's packages: its tests import and its benchmark runs
with only what that machine has (scripts/gpu_machine_packages.txt) and what
scripts/gpu_wheels.sh carries, so a module that starts importing Ray, vLLM or FastAPI on the
way is caught here, not in a device run.

The packages are this machine's installs of those names (transformers 5.19 here against 5.17
there, Python 3.11 against 3.12), linked into a site directory the interpreter gets alone
(``python -S``); the GPU itself is what stays untried.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "scripts"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def gpu_machine_packages() -> set[str]:
    """The machine's own packages and the carried wheels' (``name==version`` in gpu_wheels.sh)."""
    lines = (SCRIPTS / "gpu_machine_packages.txt").read_text().splitlines()
    own = {_name(line) for line in lines if line and not line.startswith("#")}
    carried = re.findall(r"([A-Za-z0-9_.-]+)==", (SCRIPTS / "gpu_wheels.sh").read_text())
    return own | {_name(n) for n in carried}


def bare_site(site: Path) -> set[str]:
    """Links into ``site`` the installed distributions of ``gpu_machine_packages()`` and of
    what they require (their own dependencies are there too); returns the names linked."""
    site_packages = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    installed = {}  # the first of a name, as imports find it; not what tests put on sys.path
    for dist in md.distributions(path=site_packages):
        installed.setdefault(_name(dist.metadata["Name"]), dist)
    installed.setdefault("nixl-cu13", installed.get("nixl-cu12"))  # the CUDA build here
    wanted = {n for n in gpu_machine_packages() if installed.get(n) is not None}
    todo = list(wanted)
    while todo:
        for requirement in map(Requirement, installed[todo.pop()].requires or []):
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = _name(requirement.name)
            if name in installed and name not in wanted:
                wanted.add(name)
                todo.append(name)
    site.mkdir()
    for name in wanted:
        dist = installed[name]
        for top in {str(f).split("/")[0] for f in dist.files or []}:
            source = Path(dist.locate_file(top))
            if top.startswith("..") or top == "__pycache__" or not source.exists():
                continue
            if not (site / top).exists():
                (site / top).symlink_to(source)
    return wanted


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """Runs Python code as the GPU check would there: only the bare site and the repo."""
    site = tmp_path_factory.mktemp("gpu_machine") / "site"
    bare_site(site)
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}:{ROOT}",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-S", *args]
        return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)

    return run


def test_the_bare_site_lacks_what_the_gpu_machine_lacks(bare_python):
    found = bare_python(
        "-c",
        "import importlib.util as u; "
        "print([m for m in ('ray', 'vllm', 'fastapi', 'soundfile', 'torch', 'pydantic') "
        "if u.find_spec(m)])",
    )
    assert found.stdout.strip() == "['torch', 'pydantic']", found.stderr[-2000:]


def test_the_gpu_checks_tests_import_there(bare_python):
    """The test files gpu_check.sh names are collected (their GPU tests skip here)."""
    named = re.findall(r"(?<![\w/])tests/\S+\.py(?:::\w+)?", (SCRIPTS / "gpu_check.sh").read_text())
    assert len(set(named)) >= 5
    args = ["-m", "pytest", "-p", "no:cacheprovider", "-p", "asyncio", "-p", "pytest_timeout"]
    collected = bare_python(*args, "--collect-only", "-q", *sorted(set(named)))
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    found = re.search(r"^(\d+) tests? collected", collected.stdout, re.M)
    assert found, collected.stdout[-500:]
    count = int(found.group(1))
    assert count >= 15


def test_the_gpu_stages_benchmark_runs_there(bare_python, tmp_path):
    """Its CPU smoke run (``--quick``: the tiny model), every section, into ``tmp_path``; the
    channel benchmark (GPU only) imports."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'load_tests')!r}); "
        "sys.argv = ['bench_gpu_stages.py', '--quick']; import bench_channel_gpu; "
        "from pathlib import Path; import bench_gpu_stages as b; "
        f"b.RESULTS = Path({str(tmp_path)!r}); b.main()"
    )
    ran = bare_python("-c", code)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    summary = json.loads((tmp_path / "bench_gpu_stages.json").read_text())
    sections = ("talker_step", "end_to_end", "code2wav", "transformers", "qwen2_5_talker_step")
    for section in sections:
        assert summary[section], section
        rows = summary[section] if isinstance(summary[section], list) else [summary[section]]
        assert not [r for r in rows if isinstance(r, dict) and r.get("error")], section
