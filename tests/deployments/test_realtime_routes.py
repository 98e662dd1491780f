"""The Realtime start cushion follows the ingress replica's speech load: nothing held while a
session's answer speaks alone, ``realtime_start_cushion_ms`` more for each other spoken chat
beside it (by any way in: the count is the chat path's own), and neither a text-only chat (a
turn's transcript) nor the session's own early answer winding down counts."""

from __future__ import annotations

import types
from contextlib import AsyncExitStack, aclosing

import pytest

import deployments.omni_chat as omni_chat
from deployments.omni_chat import OmniChat
from deployments.realtime_routes import _OwnAnswers
from omni_serve.config.pipeline import ApiSettings
from omni_serve.models.thinker_talker.chat_flow import ChatOptions
from omni_serve.observability.metrics import ApiMetrics
from tests.deployments.bare_ingress import IngressClass


async def talking(clients, prompt, options, request_id):
    """The stages' events for a chat that has not finished yet."""
    yield types.SimpleNamespace(kind="text", text="hi")
    yield types.SimpleNamespace(kind="text", text=" there")


@pytest.fixture(autouse=True)
def stages(monkeypatch):
    monkeypatch.setattr(omni_chat, "stream_chat", talking)


def ingress(cushion_ms: int) -> IngressClass:
    chat = object.__new__(OmniChat)
    chat.metrics, chat.speaking_in_flight = ApiMetrics(), 0
    chat.sessions = chat.replies = chat.clients = None
    made = object.__new__(IngressClass)
    made.chat = chat
    made.config = types.SimpleNamespace(api=ApiSettings(realtime_start_cushion_ms=cushion_ms))
    return made


class Running:
    """Chats started and held open until the block ends."""

    def __init__(self, served: IngressClass) -> None:
        self.chat, self.stack = served.chat, AsyncExitStack()

    async def __aenter__(self) -> Running:
        await self.stack.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stack.__aexit__(*exc)

    async def start(self, speaking: bool, own: _OwnAnswers | None = None) -> None:
        events = self.chat.events(None, ChatOptions({}, want_audio=speaking), "r")
        if own is not None:
            events = own.counted(events)
        stream = await self.stack.enter_async_context(aclosing(events))
        await anext(stream)


async def test_the_cushion_grows_with_the_spoken_chats_beside_a_sessions_answer():
    served, mine = ingress(400), _OwnAnswers()
    seen = []
    async with Running(served) as running:
        await running.start(True, mine)
        seen.append(served._start_cushion_s(mine))  # alone
        await running.start(True)  # another session's answer, or /v1/audio/speech
        seen.append(served._start_cushion_s(mine))
        async with Running(served) as more:
            await more.start(True)
            seen.append(served._start_cushion_s(mine))  # two others
        seen.append(served._start_cushion_s(mine))  # that one ended
    assert seen == [0.0, 0.4, 0.8, 0.4]
    assert served._start_cushion_s(mine) == 0.0
    assert served.chat.speaking_in_flight == 0 and mine.running == 0


async def test_a_transcript_and_the_sessions_own_early_answer_do_not_count():
    served, mine = ingress(400), _OwnAnswers()
    async with Running(served) as running:
        await running.start(True, mine)  # an early answer, discarded, still winding down
        await running.start(True, mine)  # the answer shown
        await running.start(False)  # the turn's transcript: text only
        assert served._start_cushion_s(mine) == 0.0
        assert served.chat.speaking_in_flight == 2 and mine.running == 2


async def test_a_cushion_of_zero_holds_nothing_under_load():
    served = ingress(0)
    served.chat.speaking_in_flight = 8
    assert served._start_cushion_s(_OwnAnswers()) == 0.0


def test_a_sessions_limits_are_the_apps():
    """The pipeline config's api settings, the Thinker's audio items a prompt and the family's
    transcription languages reach every Realtime session."""
    served = ingress(0)
    served.config = types.SimpleNamespace(
        served_model_name="qwen3-omni",
        api=ApiSettings(
            max_tokens_limit=100, default_max_tokens=300, realtime_max_conversation_bytes=99_999
        ),
    )
    served.chat.voices, served.chat.media_limits = {"ethan"}, {"audio": {"count": 3}}
    served.transcription = types.SimpleNamespace(languages=["en", "de"])
    limits = served._session_limits()
    assert (limits.model, limits.voices) == ("qwen3-omni", frozenset({"ethan"}))
    assert (limits.max_tokens, limits.default_tokens) == (100, 100)
    assert limits.languages == frozenset({"en", "de"}) and limits.audio_items == 3
    assert limits.conversation_bytes == 99_999
