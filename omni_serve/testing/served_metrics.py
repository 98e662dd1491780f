"""Reading a served app's ``/metrics`` in tests: one series' value, and whether every stage
has stopped working (a cancel, a deadline, a barge-in, a client that left)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


def metric(text: str, name: str) -> float:
    """The value of the first series in Prometheus ``text`` that starts with ``name``."""
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    raise KeyError(f"no series {name!r} on /metrics")


@dataclass(frozen=True)
class Idleness:
    """What the last look at ``/metrics`` saw: truthy when every stage had stopped. Its repr
    is what a failed ``assert stages_idle_within(...)`` prints, so a slow stop shows which
    count stayed up and for how long."""

    idle: bool
    waited_s: float
    talker_running: float
    in_flight: float

    def __bool__(self) -> bool:
        return self.idle


# How soon every stage must stop after a cancel. 1.5 s was once too short on a loaded 2-core
# CI machine (a WebSocket cancel); it must stay well under the work the stories leave after
# their cancel (the tiny app's 500 Talker frames: ~3.8 s on CI), or a stage that never stopped
# would pass by finishing.
STOP_WITHIN_S = 2.5


def stages_idle_within(
    base_url: str, seconds: float = STOP_WITHIN_S, poll_s: float = 0.1
) -> Idleness:
    """Whether the Talker runs nothing and no request is in flight within ``seconds``."""
    start = time.monotonic()
    while True:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        talker = metric(text, 'omni_stage_running_requests{stage="talker"}')
        in_flight = metric(text, "omni_requests_in_flight")
        waited = time.monotonic() - start
        if (talker == 0 and in_flight == 0) or waited > seconds:
            return Idleness(talker == 0 and in_flight == 0, round(waited, 2), talker, in_flight)
        time.sleep(poll_s)
