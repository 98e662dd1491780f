"""/health answers 503 naming the stage that does not answer, instead of hanging."""

from __future__ import annotations

import asyncio
import json

from omni_serve.observability.health import stage_health


class _Method:
    def __init__(self, hang: bool, ready: bool) -> None:
        self.hang, self.is_ready = hang, ready

    def remote(self):
        async def call():
            if self.hang:
                await asyncio.sleep(3600)
            return self.is_ready

        return call()


class _Handle:
    def __init__(self, hang: bool = False, ready: bool = True) -> None:
        self.ready = _Method(hang, ready)


async def test_health_is_503_while_a_stage_does_not_answer():
    response = await stage_health({"thinker": _Handle(), "talker": _Handle(hang=True)}, 0.2)
    assert response.status_code == 503
    assert json.loads(response.body)["stages"] == ["talker: TimeoutError"]


async def test_health_is_200_when_every_stage_answers():
    response = await stage_health({"thinker": _Handle(), "talker": _Handle()})
    assert response.status_code == 200
    assert json.loads(response.body)["stages"] == ["talker", "thinker"]


async def test_health_is_503_while_a_stage_says_its_engine_is_not_running():
    """A replica whose engine died (vLLM's core process killed) still answers, with False."""
    response = await stage_health({"thinker": _Handle(ready=False), "talker": _Handle()})
    assert response.status_code == 503
    assert json.loads(response.body)["stages"] == ["thinker: engine not running"]


async def test_health_gives_serves_reason_for_the_failing_stages_only():
    said = {"thinker": "UNHEALTHY: ValidationError: kv_cache_dtype", "talker": "UPDATING: x"}
    handles = {"thinker": _Handle(hang=True), "talker": _Handle()}
    response = await stage_health(handles, 0.2, explain=lambda: said)
    assert json.loads(response.body)["reasons"] == {"thinker": said["thinker"]}


async def test_health_answers_when_the_explanation_fails():
    def broken() -> dict[str, str]:
        raise ConnectionError("controller unreachable")

    response = await stage_health({"thinker": _Handle(ready=False)}, explain=broken)
    assert response.status_code == 503 and json.loads(response.body)["reasons"] == {}


async def test_a_degraded_part_is_named_with_its_reason_and_health_stays_200():
    reason = {"kv_store.disk": "writing x.kvpage: [Errno 28] No space left on device"}
    response = await stage_health({"thinker": _Handle()}, degraded=reason)
    assert response.status_code == 200
    assert json.loads(response.body) == {"status": "ok", "stages": ["thinker"], "degraded": reason}
