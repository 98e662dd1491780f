from __future__ import annotations

import asyncio
from types import SimpleNamespace

from omni_serve.observability.metrics import ApiMetrics


def _value(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_result_timings_become_stage_latencies_and_rtf():
    metrics = ApiMetrics()
    timings = {
        "first_token_s": 0.1,
        "first_frame_s": 0.2,
        "first_audio_s": 0.3,
        "total_s": 2.0,
        "rtf": 0.5,
    }
    metrics.observe_result(timings, tokens=7, audio_s=4.0)
    text = metrics.render().decode()
    assert _value(text, 'omni_stage_latency_seconds_sum{stage="first_frame"}') == 0.2
    assert _value(text, 'omni_stage_latency_seconds_count{stage="first_audio"}') == 1
    assert _value(text, "omni_audio_real_time_factor_sum") == 0.5
    assert _value(text, 'omni_audio_real_time_factor_bucket{le="0.5"}') == 1
    assert _value(text, 'omni_audio_real_time_factor_bucket{le="0.25"}') == 0
    assert _value(text, "omni_text_tokens_total") == 7


def test_stage_stats_become_gauges_with_busy_seconds_per_phase():
    metrics = ApiMetrics()
    metrics.observe_stage_stats(
        "talker", {"steps": 40, "max_batch": 4, "running": 2, "prefill_s": 0.5, "decode_s": 2.25}
    )
    text = metrics.render().decode()
    assert _value(text, 'omni_stage_steps{stage="talker"}') == 40
    assert _value(text, 'omni_stage_busy_seconds{phase="decode",stage="talker"}') == 2.25
    assert _value(text, 'omni_stage_busy_seconds{phase="prefill",stage="talker"}') == 0.5
    assert 'phase="emit"' not in text  # a stage that does not report a phase has no series


class _Stage:
    """A stage handle whose ``stats.remote()`` answers ``stats``, or not within a scrape's
    timeout while ``busy``."""

    def __init__(self, stats: dict) -> None:
        self.latest, self.busy = stats, False
        self.stats = SimpleNamespace(remote=self._stats)

    async def _stats(self) -> dict:
        if self.busy:
            await asyncio.sleep(10)
        return self.latest


async def test_a_stage_that_does_not_answer_keeps_its_gauges_and_says_how_old_they_are():
    """An operator (or a test) can tell a stale stage gauge from a fresh one."""
    metrics, talker = ApiMetrics(), _Stage({"max_batch": 1})
    await metrics.poll_stages({"talker": talker}, timeout_s=0.05)
    text = metrics.render().decode()
    assert _value(text, 'omni_stage_max_batch_size{stage="talker"}') == 1
    assert _value(text, 'omni_stage_stats_age_seconds{stage="talker"}') < 0.05
    talker.latest, talker.busy = {"max_batch": 8}, True
    await asyncio.sleep(0.1)
    await metrics.poll_stages({"talker": talker}, timeout_s=0.05)
    text = metrics.render().decode()
    assert _value(text, 'omni_stage_max_batch_size{stage="talker"}') == 1  # the last values
    assert _value(text, 'omni_stage_stats_age_seconds{stage="talker"}') >= 0.15
    talker.busy = False
    await metrics.poll_stages({"talker": talker}, timeout_s=0.05)
    text = metrics.render().decode()
    assert _value(text, 'omni_stage_max_batch_size{stage="talker"}') == 8
    assert _value(text, 'omni_stage_stats_age_seconds{stage="talker"}') < 0.05


async def test_a_stage_never_heard_from_has_no_age():
    metrics, talker = ApiMetrics(), _Stage({})
    talker.busy = True
    await metrics.poll_stages({"talker": talker}, timeout_s=0.01)
    assert "omni_stage_stats_age_seconds{" not in metrics.render().decode()


def test_a_stages_channel_counts_become_series_per_backend():
    """Which backend each stage's payloads came by, so an operator sees a cluster that spans
    hosts (object store) or a full /dev/shm (overflowed) without reading logs."""
    metrics = ApiMetrics()
    channel = {
        "taken": {
            "shared_memory": {"payloads": 5, "bytes": 5 << 20, "seconds": 0.01, "failed": 0},
            "inline": {"payloads": 3, "bytes": 300, "seconds": 0.001, "failed": 1},
        },
        "overflowed": 2,
        "pool_bytes": 8 << 20,
    }
    metrics.observe_stage_stats("thinker", {"channel": channel})
    metrics.observe_channel("ingress", {"channel": {**channel, "taken": {}}})
    text = metrics.render().decode()
    shared = '{backend="shared_memory",stage="thinker"}'
    assert _value(text, f"omni_channel_taken_payloads{shared}") == 5
    assert _value(text, f"omni_channel_taken_bytes{shared}") == 5 << 20
    assert _value(text, 'omni_channel_taken_failed{backend="inline",stage="thinker"}') == 1
    assert _value(text, 'omni_channel_overflowed{stage="thinker"}') == 2
    assert _value(text, 'omni_channel_pool_bytes{stage="ingress"}') == 8 << 20
    assert 'omni_stage_running_requests{stage="thinker"}' not in text  # reported no engine
