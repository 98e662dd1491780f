from __future__ import annotations

import httpx

from omni_serve.testing import served_metrics
from omni_serve.testing.served_metrics import stages_idle_within

BUSY = 'omni_stage_running_requests{stage="talker"} 1.0\nomni_requests_in_flight 1.0\n'
IDLE = 'omni_stage_running_requests{stage="talker"} 0.0\nomni_requests_in_flight 0.0\n'


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
