"""/health answers 503 naming the stage that does not answer, instead of hanging."""

from __future__ import annotations

import asyncio
import json

from deployments import ingress


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


def make_ingress(handles):
    cls = ingress.Ingress.func_or_class
    obj = cls.__new__(cls)  # skip __init__ (it loads the processor)
    obj.handles = handles
    return obj


async def test_health_is_503_while_a_stage_does_not_answer(monkeypatch):
    monkeypatch.setattr(ingress, "HEALTH_TIMEOUT_S", 0.2)
    obj = make_ingress({"thinker": _Handle(), "talker": _Handle(hang=True)})
    response = await obj.health()
    assert response.status_code == 503
    assert json.loads(response.body)["stages"] == ["talker: TimeoutError"]


async def test_health_is_200_when_every_stage_answers():
    obj = make_ingress({"thinker": _Handle(), "talker": _Handle()})
    response = await obj.health()
    assert response.status_code == 200
