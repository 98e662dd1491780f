"""The Realtime start cushion follows the ingress replica's load: nothing held while an answer
runs alone, ``realtime_start_cushion_ms`` more for each other chat running beside it, back to
nothing once they end (the count is the chat path's own, so every way in counts)."""

from __future__ import annotations

import types
from contextlib import aclosing

from deployments.omni_chat import OmniChat
from deployments.omni_ingress import OmniIngress
from omni_serve.config.pipeline import ApiSettings
from omni_serve.observability.metrics import ApiMetrics

IngressClass = next(k for k in OmniIngress.func_or_class.__mro__[1:] if k.__name__ == "OmniIngress")


async def talking():
    yield types.SimpleNamespace(kind="text", text="hi")
    yield types.SimpleNamespace(kind="text", text=" there")


def ingress(cushion_ms: int) -> IngressClass:
    chat = object.__new__(OmniChat)
    chat.metrics, chat.requests_in_flight = ApiMetrics(), 0
    made = object.__new__(IngressClass)
    made.chat = chat
    made.config = types.SimpleNamespace(api=ApiSettings(realtime_start_cushion_ms=cushion_ms))
    return made


async def test_the_cushion_grows_with_the_chats_running_beside_an_answer():
    served = ingress(400)
    streams = [served.chat.observed(talking(), 0.0) for _ in range(3)]
    seen = []
    async with aclosing(streams[0]) as first, aclosing(streams[1]) as second:
        await anext(first)
        seen.append(served._start_cushion_s())  # alone
        await anext(second)
        seen.append(served._start_cushion_s())  # one other
        async with aclosing(streams[2]) as third:
            await anext(third)
            seen.append(served._start_cushion_s())  # two others
        seen.append(served._start_cushion_s())  # the third ended
    assert seen == [0.0, 0.4, 0.8, 0.4]
    assert served._start_cushion_s() == 0.0 and served.chat.requests_in_flight == 0


async def test_a_cushion_of_zero_holds_nothing_under_load():
    served = ingress(0)
    served.chat.requests_in_flight = 8
    assert served._start_cushion_s() == 0.0
