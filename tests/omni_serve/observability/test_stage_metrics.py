from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry, generate_latest

from omni_serve.observability.stage_metrics import StageGauges, export_stage_stats


def _text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


async def _run_for(coro, seconds: float) -> None:
    task = asyncio.create_task(coro)
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_the_export_loop_keeps_a_replicas_gauges_current():
    """What each stage replica runs for Ray's export: its latest stats(), async or not."""
    registry = CollectorRegistry()
    steps = iter(range(1000))

    async def stats():
        return {"steps": next(steps), "running": 1, "decode_s": 0.5}

    await _run_for(export_stage_stats("talker", stats, 0.01, StageGauges(registry)), 0.2)
    last = next(steps) - 1
    assert last >= 3  # it ran repeatedly
    assert f'omni_stage_steps{{stage="talker"}} {float(last)}' in _text(registry)
    assert 'omni_stage_busy_seconds{phase="decode",stage="talker"} 0.5' in _text(registry)


async def test_a_failing_stats_is_logged_once_and_tried_again(caplog):
    registry = CollectorRegistry()
    calls = []

    def stats():
        calls.append(1)
        if len(calls) < 4:
            raise RuntimeError("engine busy")
        return {"steps": 7}

    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        await _run_for(export_stage_stats("vae", stats, 0.01, StageGauges(registry)), 0.2)
    assert len([r for r in caplog.records if "engine busy" in r.getMessage()]) == 1
    assert 'omni_stage_steps{stage="vae"} 7.0' in _text(registry)


def test_an_encoders_item_cache_shows_by_field():
    registry = CollectorRegistry()
    cache = {"hits": 3, "misses": 5, "items": 4, "bytes": 4096}
    StageGauges(registry).observe("encoder", {"steps": 8, "item_cache": cache})
    text = _text(registry)
    for field, value in cache.items():
        assert f'omni_encoder_item_cache{{field="{field}",stage="encoder"}} {float(value)}' in text


def test_a_one_phase_stages_busy_time_shows_as_its_run_phase():
    registry = CollectorRegistry()
    StageGauges(registry).observe("dit", {"steps": 3, "run_s": 12.5})
    assert 'omni_stage_busy_seconds{phase="run",stage="dit"} 12.5' in _text(registry)
