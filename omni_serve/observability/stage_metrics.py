"""The series of a stage's ``stats()`` dict, and the loop that exports a replica's own to Ray.

The ingress renders them on ``/metrics`` from one ``stats()`` call per stage at each scrape
(one replica's view). Every stage replica also exports its own through Ray's metrics export
(``omni_serve.observability.series``), refreshed every ``OMNI_METRICS_EXPORT_INTERVAL_S``
seconds, so that a scaled-out stage shows each replica.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from omni_serve.observability.series import Series

log = logging.getLogger("ray.serve")
EXPORT_INTERVAL_S = float(os.environ.get("OMNI_METRICS_EXPORT_INTERVAL_S", "5"))

_WHAT_TAKEN = {
    "payloads": "Channel payloads a stage's replica has read",
    "bytes": "Bytes of channel payloads a stage's replica has read",
    "seconds": "Seconds a stage's replica has spent reading channel payloads",
    "failed": "Channel refs a stage's replica could not read (freed, producer gone)",
}
_BY_BACKEND = "since the replica started, by the backend they came by (auto picks per payload)"


class StageGauges:
    """Gauges set from a stage's ``stats()``: only those the stage reports (the Thinker
    reports its channel only: its engine's numbers are vLLM's)."""

    def __init__(self, registry: CollectorRegistry | None = None, to_ray: bool = False) -> None:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("stage",)) -> Series:
            return Series("gauge", name, doc, labels, registry=registry, to_ray=to_ray)

        self.running = gauge("omni_stage_running_requests", "Requests running in a stage's engine.")
        self.max_batch = gauge("omni_stage_max_batch_size", "Largest batch a stage has run.")
        self.steps = gauge("omni_stage_steps", "Batched steps a stage has run.")
        self.busy = gauge(
            "omni_stage_busy_seconds",
            "Seconds a stage's engine has spent per phase (prefill, decode, emit; run for "
            "stages of one phase: the text encoder, DiT and VAE) since it started; its rate "
            "over wall time is how busy the stage is.",
            ("stage", "phase"),
        )
        self.channel_taken = {
            field: gauge(
                f"omni_channel_taken_{field}", f"{what} {_BY_BACKEND}.", ("stage", "backend")
            )
            for field, what in _WHAT_TAKEN.items()
        }
        self.channel_overflowed = gauge(
            "omni_channel_overflowed",
            "Payloads a stage's replica put that found its shared memory full and went through "
            "the object store instead (raise OMNI_SHM_POOL_BYTES or /dev/shm).",
        )
        self.channel_pool_bytes = gauge(
            "omni_channel_pool_bytes",
            "Shared memory a stage's replica holds for its payloads (its pool's segments).",
        )
        self.item_cache = gauge(
            "omni_encoder_item_cache",
            "An encoder replica's cache of media items' rows: items found there (hits) and "
            "encoded (misses) since it started, and what it holds (items, bytes).",
            ("stage", "field"),
        )

    def observe(self, stage: str, stats: dict[str, Any]) -> None:
        for series, key in (
            (self.running, "running"),
            (self.max_batch, "max_batch"),
            (self.steps, "steps"),
        ):
            if key in stats:
                series.labels(stage).set(stats[key])
        for phase in ("prefill", "decode", "emit", "run"):
            if f"{phase}_s" in stats:
                self.busy.labels(stage, phase).set(stats[f"{phase}_s"])
        for field, value in stats.get("item_cache", {}).items():
            self.item_cache.labels(stage, field).set(value)
        self.observe_channel(stage, stats)

    def observe_channel(self, stage: str, stats: dict[str, Any]) -> None:
        """The channel counters of a ``stats()`` dict, under its ``channel`` key
        (``transport.channel_stats``: what the stage's replica has read, by backend)."""
        channel = stats.get("channel")
        if not channel:
            return
        for backend, taken in channel["taken"].items():
            for field, series in self.channel_taken.items():
                series.labels(stage, backend).set(taken[field])
        self.channel_overflowed.labels(stage).set(channel["overflowed"])
        self.channel_pool_bytes.labels(stage).set(channel["pool_bytes"])


async def export_stage_stats(
    stage: str,
    stats: Callable[[], Any],
    interval_s: float = EXPORT_INTERVAL_S,
    gauges: StageGauges | None = None,
) -> None:
    """Sets this replica's stage gauges in Ray's export from ``stats()`` (sync or async)
    every ``interval_s``, for as long as the replica lives. A failing ``stats()`` is logged
    once and tried again: metrics never take a stage down."""
    gauges = gauges or StageGauges(to_ray=True)
    warned = False
    while True:
        try:
            result = stats()
            gauges.observe(stage, await result if inspect.isawaitable(result) else result)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            if not warned:
                log.warning("stage %s: exporting its stats to Ray failed: %r", stage, exc)
                warned = True
        await asyncio.sleep(interval_s)
