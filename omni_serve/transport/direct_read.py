"""One NIXL READ from another process's registered memory, driven to its end or a deadline
(the direct backend's consumer side, ``direct_endpoint``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from omni_serve.transport.base import ChannelError
from omni_serve.transport.direct_buffers import Where


def nixl_read(
    agent: Any,
    lock: threading.Lock,
    local: torch.Tensor,
    remote: list[tuple[int, int, int]],
    where: Where,
    timeout_s: float,
) -> str:
    """The transfer's last state: "DONE", "PROC" (past ``timeout_s``) or "ERR". NIXL's own
    exceptions (remote disconnected, not found) come out as ``ChannelError``. The agent is
    called under ``lock``: its owner's notification thread drives the same agent."""
    handle, state = None, "ERR"
    deadline = time.monotonic() + timeout_s
    try:
        with lock:
            handle = agent.initialize_xfer(
                "READ",
                agent.get_xfer_descs(local),
                agent.get_xfer_descs(remote, where.mem_type),
                where.agent,
            )
            state = agent.transfer(handle)
        while state == "PROC" and time.monotonic() < deadline:
            with lock:
                state = agent.check_xfer_state(handle)
    except Exception as exc:  # nixl raises its own types
        raise ChannelError(f"reading direct ref from {where.agent} failed: {exc}") from exc
    finally:
        if handle is not None:
            with lock:
                handle.release()
    return state
