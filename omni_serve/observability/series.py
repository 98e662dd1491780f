"""A metric recorded in up to two places: a replica's own Prometheus registry (what the
ingress's ``/metrics`` renders), and Ray's metrics export.

``/metrics`` is one replica's view: Serve's proxy sends the scrape to one ingress replica, and
that replica asks each stage through one ``stats()`` call, which one of the stage's replicas
answers. Right while every deployment has one replica; once one scales out, its counters seem
to jump back and forth between replicas (Prometheus reads each drop as a restart). Ray's
export has every replica's own series, tagged ``deployment``, ``replica`` and ``application``
by ``ray.serve.metrics``, on each node's metrics port, where Prometheus adds them up. There a
series is named as here with Ray's ``ray_`` prefix (``ray_omni_requests_total``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

Kind = Literal["counter", "gauge", "histogram"]
_PROMETHEUS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


def ray_metric(kind: Kind, name: str, doc: str, labels: tuple[str, ...], buckets: Any) -> Any:
    """A ``ray.serve.metrics`` metric (in a Serve replica it adds the replica's tags)."""
    from ray.serve import metrics

    if kind == "histogram":
        return metrics.Histogram(name, doc, boundaries=list(buckets), tag_keys=labels)
    return (metrics.Counter if kind == "counter" else metrics.Gauge)(name, doc, tag_keys=labels)


class Series:
    """The subset of prometheus_client's metric API the API layer uses (``labels``, ``inc``,
    ``dec``, ``set``, ``observe``), recorded in the registry, in Ray's export, or both."""

    def __init__(
        self,
        kind: Kind,
        name: str,
        doc: str,
        labels: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None = None,
        to_ray: bool = False,
        buckets: Sequence[float] | None = None,
    ) -> None:
        self.kind = kind
        self.labelnames = tuple(labels)
        extra = {"buckets": tuple(buckets)} if buckets is not None else {}
        self._prometheus = (
            _PROMETHEUS[kind](name, doc, self.labelnames, registry=registry, **extra)
            if registry is not None
            else None
        )
        self._ray = ray_metric(kind, name, doc, self.labelnames, buckets) if to_ray else None
        self._gauge_values: dict[tuple[str, ...], float] = {}  # Ray's Gauge has no inc/dec

    def labels(self, *values: str) -> _Labelled:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.labelnames} takes {len(self.labelnames)} values: {values}")
        return _Labelled(self, tuple(str(v) for v in values))

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float) -> None:
        self.labels().observe(value)


class _Labelled:
    """One series of a ``Series``: its label values bound."""

    def __init__(self, series: Series, values: tuple[str, ...]) -> None:
        self.series = series
        self.values = values

    def _prometheus(self) -> Any:
        metric = self.series._prometheus
        return metric.labels(*self.values) if self.values else metric

    def _tags(self) -> dict[str, str]:
        return dict(zip(self.series.labelnames, self.values, strict=True))

    def inc(self, amount: float = 1.0) -> None:
        if self.series.kind == "gauge":
            self.set(self.series._gauge_values.get(self.values, 0.0) + amount)
            return
        if self.series._prometheus is not None:
            self._prometheus().inc(amount)
        if self.series._ray is not None and amount > 0:  # Ray's Counter refuses 0
            self.series._ray.inc(amount, tags=self._tags())

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)

    def set(self, value: float) -> None:
        self.series._gauge_values[self.values] = value
        if self.series._prometheus is not None:
            self._prometheus().set(value)
        if self.series._ray is not None:
            self.series._ray.set(value, tags=self._tags())

    def observe(self, value: float) -> None:
        if self.series._prometheus is not None:
            self._prometheus().observe(value)
        if self.series._ray is not None:
            self.series._ray.observe(value, tags=self._tags())
