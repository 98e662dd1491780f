"""Prometheus metrics of the API layer (one registry per ingress replica), also recorded in
Ray's metrics export in a Serve replica (``omni_serve.observability.series`` says why)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from omni_serve.observability.series import Series
from omni_serve.observability.stage_metrics import StageGauges

log = logging.getLogger("ray.serve")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ApiMetrics:
    def __init__(self, to_ray: bool = False) -> None:
        self.registry = CollectorRegistry()
        own = {"registry": self.registry, "to_ray": to_ray}
        self.requests = Series(
            "counter", "omni_requests", "Requests by outcome, every way in.", ["status"], **own
        )
        self.in_flight = Series("gauge", "omni_requests_in_flight", "Requests being served.", **own)
        self.stage_latency = Series(
            "histogram",
            "omni_stage_latency_seconds",
            "Time from request start to a point of the pipeline: first_token (Thinker), "
            "first_frame (Talker), first_audio (Code2wav, = TTFP), thinker (text done), total.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            **own,
        )
        self.rtf = Series(
            "histogram",
            "omni_audio_real_time_factor",
            "Request time / audio seconds produced (< 1: faster than real time).",
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8),
            **own,
        )
        self.tokens = Series("counter", "omni_text_tokens", "Text tokens generated.", **own)
        self.prompt_tokens = Series(
            "counter",
            "omni_prompt_tokens",
            "Prompt tokens of chat requests: 'computed' by the Thinker, or 'cached' (their KV "
            "came from its prefix cache or a session's handover).",
            ["kind"],
            **own,
        )
        self.session_kv = Series(
            "gauge",
            "omni_session_kv",
            "The app's KV store of conversations' prefixes, per tier ('host', 'disk'; 'all' "
            "for the store): 'prefixes', 'bytes', 'max_bytes', 'hits', 'evictions', "
            "'load_seconds', 'writes', 'write_errors', 'refused'; for 'all': 'prefixes', "
            "'misses', 'declined' (left on disk: computing was cheaper) and 'degraded' (1: "
            "the disk tier cannot write). Every ingress replica reports the one store.",
            ["tier", "what"],
            registry=self.registry,  # one store: /metrics is right about it
        )
        self.spoken_replies = Series(
            "gauge",
            "omni_spoken_replies",
            "Transcripts the app keeps under spoken replies' audio ids for later turns to name "
            "(every ingress replica reports the one store): 'replies', 'bytes'.",
            ["what"],
            registry=self.registry,
        )
        self.audio_seconds = Series(
            "counter", "omni_audio_seconds", "Seconds of audio produced.", **own
        )
        # Read from the stages at each scrape; in Ray's export each stage replica sets its own.
        self.stages = StageGauges(registry=self.registry)
        self.stats_age = Series(
            "gauge",
            "omni_stage_stats_age_seconds",
            "Seconds since a scrape last got a stage's stats(): near 0 when the stage gauges "
            "are fresh; a stage that did not answer in time keeps its last values, this old.",
            ["stage"],
            registry=self.registry,
        )
        self._stats_at: dict[str, float] = {}

    def observe_kv_store(self, stats: dict[str, Any]) -> None:
        for tier in ("host", "disk"):
            for what, value in (stats.get(tier) or {}).items():
                self.session_kv.labels(tier, what).set(value)
        for what in ("prefixes", "misses", "declined"):
            self.session_kv.labels("all", what).set(stats[what])
        self.session_kv.labels("all", "degraded").set(int(stats["degraded"] is not None))

    def observe_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens.labels("cached").inc(cached_tokens)
        self.prompt_tokens.labels("computed").inc(max(prompt_tokens - cached_tokens, 0))

    def observe_result(self, timings: dict[str, float], tokens: int, audio_s: float) -> None:
        for stage in ("first_token", "first_frame", "first_audio", "thinker", "total"):
            if f"{stage}_s" in timings:
                self.stage_latency.labels(stage).observe(timings[f"{stage}_s"])
        if "rtf" in timings:
            self.rtf.observe(timings["rtf"])
        self.tokens.inc(tokens)
        self.audio_seconds.inc(audio_s)

    async def poll_stages(self, handles: dict[str, Any], timeout_s: float = 2.0) -> None:
        """Refreshes the stage gauges from each stage's ``stats()``; a stage that does not
        answer keeps its last values (a scrape never waits on a busy stage for long)."""
        for name, handle in handles.items():
            try:
                stats = await asyncio.wait_for(handle.stats.remote(), timeout_s)
            except Exception:
                log.warning("no stats from stage %s in %.0f s", name, timeout_s)
            else:
                self.observe_stage_stats(name, stats)
                self._stats_at[name] = time.monotonic()
            if name in self._stats_at:  # a stage never heard from has no series yet
                self.stats_age.labels(name).set(time.monotonic() - self._stats_at[name])

    def observe_stage_stats(self, stage: str, stats: dict[str, Any]) -> None:
        self.stages.observe(stage, stats)

    def observe_channel(self, stage: str, stats: dict[str, Any]) -> None:
        self.stages.observe_channel(stage, stats)

    def render(self) -> bytes:
        return generate_latest(self.registry)
