from __future__ import annotations

import httpx
import pytest

from omni_serve.testing import served_metrics
from omni_serve.testing.served_metrics import fresh_metrics, stages_idle_within


def _page(running: float, age_s: float = 0.01) -> str:
    return (
        f'omni_stage_running_requests{{stage="talker"}} {running}\n'
        f"omni_requests_in_flight {running}\n"
        f'omni_stage_stats_age_seconds{{stage="talker"}} {age_s}\n'
    )


BUSY, IDLE = _page(1.0), _page(0.0)
STALE_IDLE = _page(0.0, age_s=3.0)  # the Talker did not answer: its 0 is an old one


def _serving(monkeypatch, pages: list[str]) -> None:
    def get(url: str, timeout: float) -> httpx.Response:
        return httpx.Response(200, text=pages.pop(0) if len(pages) > 1 else pages[0])

    monkeypatch.setattr(served_metrics.httpx, "get", get)


def test_stages_that_stay_busy_fail_the_assertion_and_say_which_count_stayed_up(monkeypatch):
    _serving(monkeypatch, [BUSY])
    idle = stages_idle_within("http://x", seconds=0.2, poll_s=0.05)
    assert not idle
    assert (idle.talker_running, idle.in_flight) == (1.0, 1.0)
    assert idle.waited_s >= 0.2
    assert "talker_running=1.0" in repr(idle)


def test_stages_that_stop_pass_as_soon_as_metrics_show_it(monkeypatch):
    _serving(monkeypatch, [BUSY, BUSY, IDLE])
    idle = stages_idle_within("http://x", seconds=5, poll_s=0.01)
    assert idle
    assert idle.waited_s < 1


def test_a_talker_count_of_zero_from_a_scrape_it_did_not_answer_is_not_idle(monkeypatch):
    _serving(monkeypatch, [STALE_IDLE])
    assert not stages_idle_within("http://x", seconds=0.1, poll_s=0.02)
    _serving(monkeypatch, [STALE_IDLE, STALE_IDLE, IDLE])
    assert stages_idle_within("http://x", seconds=5, poll_s=0.01)


def test_fresh_metrics_waits_for_a_scrape_every_named_stage_answered(monkeypatch):
    _serving(monkeypatch, [STALE_IDLE, STALE_IDLE, BUSY])
    assert fresh_metrics("http://x", ("talker",)) == BUSY
    _serving(monkeypatch, [STALE_IDLE])
    with pytest.raises(AssertionError, match="did not answer a scrape"):
        fresh_metrics("http://x", ("talker",), within_s=0.3)
