"""A stage's ``deployment.cpu_cores`` on the node its replica landed on."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("ray.serve")


def usable_cores(cores: list[int] | None) -> list[int]:
    """The configured cores this process may run on. A config written for a bigger node (a
    core that is not here) still serves, unpinned on those cores, and says so once: pinning a
    thread to a core that does not exist fails silently in both torch and vLLM's OpenMP."""
    if not cores:
        return []
    available = os.sched_getaffinity(0)
    usable = [core for core in cores if core in available]
    missing = [core for core in cores if core not in available]
    if missing:
        log.warning(
            "deployment.cpu_cores %s: %s not among this node's cores %s; %s",
            cores,
            missing,
            sorted(available),
            f"pinned to {usable}" if usable else "not pinned",
        )
    return usable
