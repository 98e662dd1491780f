"""Reading Ray's metrics export the way an operator's Prometheus does, for the tests that
check every replica's series are there (docs/operations.md, "Metrics")."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Where Ray writes its nodes' metrics ports for Prometheus' file service discovery.
DISCOVERY_FILE = Path("/tmp/ray/prom_metrics_service_discovery.json")
# An app served for these tests reports to the export every 2 s (Ray's default is 10 s, an
# operator's knob: RAY_metrics_report_interval_ms), so a story waits seconds for the export to
# settle, not tens of seconds. The series are the same. Ray's agent drops a gauge that is not
# set again within two reports, so the stages set theirs every second (their default, 5 s,
# is for Ray's 10 s).
REPORT_INTERVAL_S = 2.0
QUICK_REPORTS = {
    "RAY_metrics_report_interval_ms": str(int(REPORT_INTERVAL_S * 1000)),
    "OMNI_METRICS_EXPORT_INTERVAL_S": "1",
}


def ray_export(name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one series on Ray's metrics export, from every target in the file Ray
    writes for Prometheus' file service discovery (what an operator points Prometheus at)."""
    groups = json.loads(DISCOVERY_FILE.read_text())
    found = []
    for target in (t for group in groups for t in group["targets"]):
        try:
            text = httpx.get(f"http://{target}/metrics", timeout=10).text
        except httpx.HTTPError:
            continue  # a target of another Ray process that is gone
        for family in text_string_to_metric_families(text):
            found += [(s.labels, s.value) for s in family.samples if s.name == name]
    return found


def steady(
    read: Callable[[], float], quiet_s: float = 3 * REPORT_INTERVAL_S, timeout_s: float = 120
) -> float:
    """A value once it stayed the same for ``quiet_s``: three reports of an app served with
    ``QUICK_REPORTS`` (a value still on its way lands within one or two)."""
    last, deadline = read(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        if (now := read()) == last:
            return now
        last = now
    raise AssertionError(f"still changing after {timeout_s} s: {last}")
