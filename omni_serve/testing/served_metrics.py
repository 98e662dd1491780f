"""Reading a served app's ``/metrics`` in tests: one series' value, and whether every stage
has stopped working (a cancel, a deadline, a barge-in, a client that left)."""

from __future__ import annotations

import time

import httpx


def metric(text: str, name: str) -> float:
    """The value of the first series in Prometheus ``text`` that starts with ``name``."""
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    raise KeyError(f"no series {name!r} on /metrics")


def stages_idle_within(base_url: str, seconds: float, poll_s: float = 0.1) -> bool:
    """Whether the Talker runs nothing and no request is in flight within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        talker = metric(text, 'omni_stage_running_requests{stage="talker"}')
        if talker == 0 and metric(text, "omni_requests_in_flight") == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
