"""A process started with ``multiprocessing`` (as vLLM starts its engine) exits when its
parent is killed, even one that ignores SIGTERM; vLLM's plugin loading starts the watcher in
such a process; elsewhere the watcher does nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from omni_serve.compat.vllm.exit_with_parent import watch_parent

CONTEXT = multiprocessing.get_context("spawn")


def _engine(ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    assert watch_parent(grace_s=0.5) is not None
    time.sleep(120)


def _replica(pids, ignore_sigterm: bool) -> None:
    engine = CONTEXT.Process(target=_engine, args=(ignore_sigterm,))
    engine.start()
    pids.put(engine.pid)
    time.sleep(120)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _load_vllm_plugins(names) -> None:
    import threading

    from vllm.plugins import load_general_plugins

    load_general_plugins()
    names.put(sorted(thread.name for thread in threading.enumerate()))


def test_vllms_plugin_loading_starts_the_watcher_in_a_process_vllm_starts():
    names = CONTEXT.Queue()
    child = CONTEXT.Process(target=_load_vllm_plugins, args=(names,))
    child.start()
    threads = names.get(timeout=120)
    child.join(timeout=30)
    assert "omni-exit-with-parent" in threads, threads


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["sigterm", "sigkill"])
def test_an_engine_process_exits_when_its_parent_is_killed(ignore_sigterm):
    pids = CONTEXT.Queue()
    replica = CONTEXT.Process(target=_replica, args=(pids, ignore_sigterm))
    replica.start()
    engine = pids.get(timeout=60)
    time.sleep(1.0)  # a watcher that starts after the kill ends its wait at once: either way
    assert _alive(engine)
    os.kill(replica.pid, signal.SIGKILL)
    replica.join()
    deadline = time.monotonic() + 30
    while _alive(engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(engine)
    if alive:
        os.kill(engine, signal.SIGKILL)
    assert not alive, "the engine process outlived its parent"


def test_a_process_not_started_by_multiprocessing_is_not_watched():
    assert watch_parent() is None
