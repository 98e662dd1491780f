"""Each stage's busy seconds, read off an ingress's ``/metrics`` (``omni_stage_busy_seconds``,
all phases summed): read before and after a load level, their difference over the level's wall
time is how busy each stage's engine was, and the stage near 1 is the one that saturates."""

from __future__ import annotations

import re

import httpx

BUSY = re.compile(r"^omni_stage_busy_seconds\{(.*)\} ([0-9.e+-]+)$")
STAGE = re.compile(r'stage="(\w+)"')


def stage_busy(url: str) -> dict[str, float]:
    """Busy seconds per stage so far."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    busy: dict[str, float] = {}
    for line in text.splitlines():
        match = BUSY.match(line)
        stage = STAGE.search(match[1]) if match else None
        if stage:
            busy[stage[1]] = busy.get(stage[1], 0.0) + float(match[2])
    return busy


def busy_per_wall_s(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    return {s: (after[s] - before.get(s, 0.0)) / wall_s for s in after}
