"""/health answers 503 naming the stage that does not answer, instead of hanging."""

from __future__ import annotations

import asyncio
import json

from omni_serve.api.health import stage_health


class _Method:
    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def remote(self):
        async def call():
            if self.hang:
                await asyncio.sleep(3600)
            return True

        return call()


class _Handle:
    def __init__(self, hang: bool = False) -> None:
        self.ready = _Method(hang)


async def test_health_is_503_while_a_stage_does_not_answer():
    response = await stage_health({"thinker": _Handle(), "talker": _Handle(hang=True)}, 0.2)
    assert response.status_code == 503
    assert json.loads(response.body)["stages"] == ["talker: TimeoutError"]


async def test_health_is_200_when_every_stage_answers():
    response = await stage_health({"thinker": _Handle(), "talker": _Handle()})
    assert response.status_code == 200
    assert json.loads(response.body)["stages"] == ["talker", "thinker"]
