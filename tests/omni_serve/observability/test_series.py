from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from omni_serve.observability import series as series_module
from omni_serve.observability.series import Series


class FakeRayMetric:
    """Records what a ``ray.serve.metrics`` metric would be given."""

    def __init__(self, kind, name, doc, labels, buckets) -> None:
        self.kind, self.name, self.labels, self.buckets = kind, name, labels, buckets
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value, tags):
        self.calls.append(("inc", value, tags))

    def set(self, value, tags):
        self.calls.append(("set", value, tags))

    def observe(self, value, tags):
        self.calls.append(("observe", value, tags))


@pytest.fixture
def fake_ray(monkeypatch):
    made: dict[str, FakeRayMetric] = {}

    def make(kind, name, doc, labels, buckets):
        made[name] = FakeRayMetric(kind, name, doc, labels, buckets)
        return made[name]

    monkeypatch.setattr(series_module, "ray_metric", make)
    return made


def _sample(registry: CollectorRegistry, line_start: str) -> float:
    text = generate_latest(registry).decode()
    return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(line_start))


def test_each_record_goes_to_the_registry_and_to_ray_with_its_labels_as_tags(fake_ray):
    registry = CollectorRegistry()
    requests = Series("counter", "omni_requests", "d", ["status"], registry=registry, to_ray=True)
    latency = Series(
        "histogram", "omni_lat", "d", ["stage"], registry=registry, to_ray=True, buckets=(0.5, 1.0)
    )
    requests.labels("ok").inc()
    requests.labels("ok").inc(2)
    latency.labels("total").observe(0.7)
    assert _sample(registry, 'omni_requests_total{status="ok"}') == 3
    assert _sample(registry, 'omni_lat_bucket{le="1.0",stage="total"}') == 1
    assert fake_ray["omni_requests"].calls == [
        ("inc", 1.0, {"status": "ok"}),
        ("inc", 2, {"status": "ok"}),
    ]
    assert fake_ray["omni_lat"].buckets == (0.5, 1.0)
    assert fake_ray["omni_lat"].calls == [("observe", 0.7, {"stage": "total"})]


def test_a_gauges_inc_and_dec_reach_ray_as_the_value_it_now_has(fake_ray):
    """Ray's Gauge only sets: in-flight requests must not export +1/-1 as their value."""
    registry = CollectorRegistry()
    in_flight = Series("gauge", "omni_in_flight", "d", registry=registry, to_ray=True)
    in_flight.inc()
    in_flight.inc()
    in_flight.dec()
    assert _sample(registry, "omni_in_flight") == 1
    assert [value for _, value, _ in fake_ray["omni_in_flight"].calls] == [1, 2, 1]


def test_a_counter_incremented_by_zero_is_not_sent_to_ray(fake_ray):
    """Ray's Counter refuses 0 (prompts with no cached tokens do that every request)."""
    tokens = Series(
        "counter", "omni_tokens", "d", ["kind"], registry=CollectorRegistry(), to_ray=True
    )
    tokens.labels("cached").inc(0)
    tokens.labels("cached").inc(5)
    assert fake_ray["omni_tokens"].calls == [("inc", 5, {"kind": "cached"})]


def test_one_sink_alone_and_label_counts_checked(fake_ray):
    registry = CollectorRegistry()
    only_here = Series("gauge", "omni_here", "d", ["what"], registry=registry)
    only_ray = Series("gauge", "omni_there", "d", ["what"], to_ray=True)
    only_here.labels("bytes").set(4)
    only_ray.labels("bytes").set(5)
    assert _sample(registry, 'omni_here{what="bytes"}') == 4
    assert "omni_here" not in fake_ray
    assert fake_ray["omni_there"].calls == [("set", 5, {"what": "bytes"})]
    with pytest.raises(ValueError, match="takes 1 values"):
        only_here.labels("bytes", "extra")
