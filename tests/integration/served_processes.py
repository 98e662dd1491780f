"""What the operations stories look at in a served app's processes: the Thinker replica and
its vLLM engine (waited for, and named when a story fails), the /dev/shm files a process maps,
and files that must go."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import ServeProcess, replica_pids


def gone_within(files: set[str], timeout_s: float) -> None:
    wait_for(
        lambda: not [f for f in files if os.path.exists(f)],
        timeout_s,
        f"the dead engine's files {sorted(files)} are removed",
    )


def health_names(url: str, stage: str) -> None:
    """/health turns 503 within 30 s and names ``stage`` among the stages that are down."""
    unhealthy = wait_for(
        lambda: (r := httpx.get(f"{url}/health", timeout=10)).status_code == 503 and r,
        30,
        f"/health reports the {stage}",
    )
    assert any(s.startswith(f"{stage}:") for s in unhealthy.json()["stages"]), unhealthy.text


def shm_files_mapped(pid: int) -> set[str]:
    """The /dev/shm files ``pid`` and its children map."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = set()
    for proc in [pid, *map(int, children.stdout.split())]:
        with open(f"/proc/{proc}/maps") as maps:
            found |= {
                line.split(maxsplit=5)[5].strip().removesuffix(" (deleted)")
                for line in maps
                if "/dev/shm/" in line
            }
    return found


def the_thinker_and_its_engine(served: ServeProcess) -> tuple[int, int]:
    """(replica pid, engine pid), waiting for them; a failure says what ran meanwhile."""
    what = f"one Thinker replica with its vLLM engine (at the start: {engine_view()})"
    try:
        return wait_for(thinker_with_engine, 240, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; at the end: {engine_view()}; {thinker_log(served)}") from None


def thinker_with_engine() -> tuple[int, int] | None:
    """(replica pid, engine pid) once the Thinker has one replica and it has its engine: an
    earlier test's replacement may still be starting (its engine is spawned late in init)."""
    pids = replica_pids("thinker")
    if len(pids) != 1:
        return None
    [pid] = pids
    engines = [child for child, args in children(pid) if "resource_tracker" not in args]
    return (pid, engines[0]) if len(engines) == 1 else None


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of each child process of ``pid``. A Thinker replica has two: its
    vLLM engine core and multiprocessing's resource tracker. The engine is not found by the
    title vLLM gives it (VLLM::EngineCore): in one run of several it served requests under its
    spawn command line. The command line is read whole from /proc: ``ps`` cuts it to the
    terminal's width, which in CI (a longer checkout path) cut "resource_tracker" off and the
    tracker counted as a second engine."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = []
    for child in map(int, out.stdout.split()):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:  # it exited meanwhile
            continue
        found.append((child, cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


def thinker_log(served: ServeProcess) -> str:
    """What Serve's controller said about the Thinker, and each Thinker replica's last lines
    (where a replica that never got its engine stopped)."""
    lines = served.tail(1_000_000).splitlines()
    said = [line[-200:] for line in lines if "controller" in line and "'thinker'" in line]
    tails = {
        pid: [line[-200:] for line in lines if f"thinker pid={pid})" in line][-8:]
        for pid in replica_pids("thinker")
    }
    return f"Serve said: {said[-12:]}; the replicas' last lines: {tails}"


def engine_view() -> str:
    """What a failure needs to name its cause: the Thinker replicas and their child processes
    (the engine among them)."""
    found = {
        pid: [(child, args[:80]) for child, args in children(pid)]
        for pid in replica_pids("thinker")
    }
    return f"Thinker replicas and their children {found}"
