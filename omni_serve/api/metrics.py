"""Prometheus metrics of the API layer (one registry per ingress replica)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("ray.serve")
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omni_requests", "Chat requests by outcome.", ["status"], registry=r
        )
        self.in_flight = Gauge("omni_requests_in_flight", "Requests being served.", registry=r)
        self.stage_latency = Histogram(
            "omni_stage_latency_seconds",
            "Time from request start to a point of the pipeline: first_token (Thinker), "
            "first_frame (Talker), first_audio (Code2wav, = TTFP), thinker (text done), total.",
            ["stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.rtf = Histogram(
            "omni_audio_real_time_factor",
            "Request time / audio seconds produced (< 1: faster than real time).",
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 8), registry=r,
        )  # fmt: skip
        self.tokens = Counter("omni_text_tokens", "Text tokens generated.", registry=r)
        self.prompt_tokens = Counter(
            "omni_prompt_tokens",
            "Prompt tokens of chat requests: 'computed' by the Thinker, or 'cached' (their KV "
            "came from its prefix cache or a session's handover).",
            ["kind"], registry=r,
        )  # fmt: skip
        self.session_kv = Gauge(
            "omni_session_kv",
            "KV prefixes the app's session store keeps for sessions' next turns (every ingress "
            "replica reports the one store): 'prefixes', 'bytes'.",
            ["what"], registry=r,
        )  # fmt: skip
        self.audio_seconds = Counter("omni_audio_seconds", "Seconds of audio produced.", registry=r)
        self.stage_queue = Gauge(
            "omni_stage_running_requests", "Requests running in a stage's engine.", ["stage"],
            registry=r,
        )  # fmt: skip
        self.stage_batch = Gauge(
            "omni_stage_max_batch_size", "Largest batch a stage has run.", ["stage"], registry=r
        )
        self.stage_steps = Gauge(
            "omni_stage_steps", "Batched steps a stage has run.", ["stage"], registry=r
        )
        self.stage_busy = Gauge(
            "omni_stage_busy_seconds",
            "Seconds a stage's engine has spent per phase (prefill, decode, emit) since it "
            "started; its rate over wall time is how busy the stage is.",
            ["stage", "phase"], registry=r,
        )  # fmt: skip
        what_taken = {
            "payloads": "Channel payloads a stage's replica has read",
            "bytes": "Bytes of channel payloads a stage's replica has read",
            "seconds": "Seconds a stage's replica has spent reading channel payloads",
            "failed": "Channel refs a stage's replica could not read (freed, producer gone)",
        }
        by = "since the replica started, by the backend they came by (auto picks per payload)"
        self.channel_taken = {
            field: Gauge(
                f"omni_channel_taken_{field}", f"{what} {by}.", ["stage", "backend"], registry=r
            )
            for field, what in what_taken.items()
        }
        self.channel_overflowed = Gauge(
            "omni_channel_overflowed",
            "Payloads a stage's replica put that found its shared memory full and went through "
            "the object store instead (raise OMNI_SHM_POOL_BYTES or /dev/shm).",
            ["stage"], registry=r,
        )  # fmt: skip
        self.channel_pool_bytes = Gauge(
            "omni_channel_pool_bytes",
            "Shared memory a stage's replica holds for its payloads (its pool's segments).",
            ["stage"], registry=r,
        )  # fmt: skip

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
                log.warning("no stats from stage %s", name)
                continue
            self.observe_stage_stats(name, stats)

    def observe_stage_stats(self, stage: str, stats: dict[str, Any]) -> None:
        """A series per value the stage reports (the Thinker reports its channel only: its
        engine's numbers are vLLM's)."""
        for gauge, key in ((self.stage_queue, "running"), (self.stage_batch, "max_batch"),
                           (self.stage_steps, "steps")):  # fmt: skip
            if key in stats:
                gauge.labels(stage).set(stats[key])
        for phase in ("prefill", "decode", "emit"):
            if f"{phase}_s" in stats:
                self.stage_busy.labels(stage, phase).set(stats[f"{phase}_s"])
        self.observe_channel(stage, stats)

    def observe_channel(self, stage: str, stats: dict[str, Any]) -> None:
        """The channel counters of a ``stats()`` dict, under its ``channel`` key
        (``transport.channel_stats``: what the stage's replica has read, by backend)."""
        channel = stats.get("channel")
        if not channel:
            return
        for backend, taken in channel["taken"].items():
            for field, gauge in self.channel_taken.items():
                gauge.labels(stage, backend).set(taken[field])
        self.channel_overflowed.labels(stage).set(channel["overflowed"])
        self.channel_pool_bytes.labels(stage).set(channel["pool_bytes"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
