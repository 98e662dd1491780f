"""Reading a served app's ``/metrics`` in tests: one series' value, a scrape whose stage
gauges are fresh, and whether every stage has stopped working (a cancel, a deadline, a
barge-in, a client that left)."""

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


# A scrape's stage gauges count as fresh when the stage answered that scrape's stats() call
# (its age is then the time since, well under this); a busy stage that did not answer in time
# keeps its last values, which a test must not read as current.
FRESH_S = 0.5


def is_fresh(text: str, stage: str) -> bool:
    """Whether ``stage`` answered the scrape ``text`` came from."""
    return metric(text, f'omni_stage_stats_age_seconds{{stage="{stage}"}}') < FRESH_S


def fresh_metrics(base_url: str, stages: tuple[str, ...], within_s: float = 30.0) -> str:
    """The first ``/metrics`` text, within ``within_s``, in which every stage of ``stages``
    answered the scrape."""
    start = time.monotonic()
    while True:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        stale = [stage for stage in stages if not is_fresh(text, stage)]
        if not stale:
            return text
        if time.monotonic() - start > within_s:
            raise AssertionError(f"stages {stale} did not answer a scrape in {within_s} s")
        time.sleep(0.2)


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
    """Whether the Talker runs nothing and no request is in flight within ``seconds``, by a
    scrape the Talker answered (its stale count could hide a Talker still at work)."""
    start = time.monotonic()
    while True:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        talker = metric(text, 'omni_stage_running_requests{stage="talker"}')
        in_flight = metric(text, "omni_requests_in_flight")
        idle = talker == 0 and in_flight == 0 and is_fresh(text, "talker")
        waited = time.monotonic() - start
        if idle or waited > seconds:
            return Idleness(idle, round(waited, 2), talker, in_flight)
        time.sleep(poll_s)
