"""The omni ingress's ``/v1/realtime``: OpenAI's Realtime API over a WebSocket
(``omni_serve.api.realtime``), each answer through the ingress's chat path.

A mixin of ``OmniIngress``, as ``AudioRoutes`` is: the route maps an answer's ``Ask`` (and a
committed turn to transcribe) to a chat request on ``self.chat`` and hands the session its
events, and nothing else.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import WebSocket, WebSocketDisconnect

from deployments.omni_api import app
from deployments.omni_chat import OmniChat
from omni_serve.api.deadline import iterate_within
from omni_serve.api.protocol import ChatCompletionRequest, error_body
from omni_serve.api.realtime.conversation import pcm_to_wav_b64
from omni_serve.api.realtime.protocol import PCM_RATE, InputTranscription, event_id
from omni_serve.api.realtime.session import RealtimeSession
from omni_serve.api.realtime.settings import Ask, Limits
from omni_serve.api.socket_session import IdleTimeout
from omni_serve.api.transcriptions import transcript_budget
from omni_serve.config import PipelineConfig
from omni_serve.models.thinker_talker.chat_flow import ChatEvent
from omni_serve.models.thinker_talker.family import SAMPLE_RATE
from omni_serve.models.thinker_talker.request import media_limit
from omni_serve.models.thinker_talker.transcribe_prompt import (
    TranscriptionPrompt,
    transcription_messages,
)

POLICY_VIOLATION = 1008  # the close code for a session this server will not hold

assert SAMPLE_RATE == PCM_RATE, "Realtime audio is 24 kHz PCM16: the model's rate, unresampled"


class _OwnAnswers:
    """A session's own spoken answers still running, an early answer winding down among
    them: its start cushion counts only the load beside it."""

    def __init__(self) -> None:
        self.running = 0

    async def counted(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[ChatEvent]:
        self.running += 1
        try:
            async with aclosing(events):
                async for event in events:
                    yield event
        finally:
            self.running -= 1


class RealtimeRoutes:
    config: PipelineConfig
    chat: OmniChat
    transcription: TranscriptionPrompt  # the family's

    @app.websocket("/v1/realtime")
    async def realtime(self, ws: WebSocket, model: str | None = None) -> None:
        """A Realtime session (``?model=`` as OpenAI's clients send it)."""
        # A browser offers "realtime" (with the key as a second subprotocol) and drops a
        # handshake that picks none.
        offered = ws.scope.get("subprotocols", [])
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        served = self.config.served_model_name
        if model is not None and model != served:
            message = f"model {model!r} does not exist; this server serves {served!r}"
            body = error_body(message, param="model", code="model_not_found")
            await ws.send_json({"type": "error", "event_id": event_id(), **body})
            await ws.close(POLICY_VIOLATION, "unknown model")
            return
        api = self.config.api
        own = _OwnAnswers()
        session = RealtimeSession(
            ws,
            functools.partial(self._realtime_answer, own),
            self._session_limits(),
            api.ws_idle_timeout_s,
            api.max_audio_bytes,
            api.realtime_early_answer_ms,
            self._realtime_transcript,
            functools.partial(self._start_cushion_s, own),
        )
        try:
            await session.run()
        except (WebSocketDisconnect, IdleTimeout):
            return
        finally:
            await session.close()

    def _session_limits(self) -> Limits:
        """What a session's settings and conversation are checked against: this app's."""
        api = self.config.api
        return Limits(
            self.config.served_model_name,
            frozenset(self.chat.voices),
            api.max_tokens_limit,
            min(api.default_max_tokens, api.max_tokens_limit),
            languages=frozenset(self.transcription.languages),
            audio_items=media_limit(self.chat.media_limits, "audio"),
            conversation_bytes=api.realtime_max_conversation_bytes,
        )

    def _start_cushion_s(self, own: _OwnAnswers) -> float:
        """Audio to hold back at an answer's start: ``realtime_start_cushion_ms`` for each
        spoken chat this replica runs beside the session's own (a transcript, text only,
        does not count)."""
        others = max(0, self.chat.speaking_in_flight - own.running)
        return self.config.api.realtime_start_cushion_ms * others / 1000

    async def _realtime_answer(self, own: _OwnAnswers, ask: Ask) -> AsyncIterator[ChatEvent]:
        """An answer's events from the chat path, under the session's id (one Thinker replica
        and its KV prefix for the whole conversation) and the server's deadline."""
        spoken = {"modalities": ["text"]}
        if ask.audio:
            spoken = {
                "modalities": ["text", "audio"],
                "audio": {"voice": ask.voice, "format": "pcm16"},
            }
        body = ChatCompletionRequest.model_validate(
            {
                "model": self.config.served_model_name,
                "messages": ask.messages,
                "stream": True,
                "max_tokens": ask.max_tokens,
                "temperature": ask.temperature,
                "seed": ask.seed,
                "session_id": ask.session_id,
                **spoken,
            }
        )
        events = await self._chat_events(body, ask.reply_room)
        return own.counted(events) if ask.audio else events

    async def _realtime_transcript(
        self, pcm: bytes, asked: InputTranscription
    ) -> AsyncIterator[ChatEvent]:
        """A committed turn's transcript, as ``/v1/audio/transcriptions`` makes it: the
        Thinker hears the clip, is told to transcribe it, and answers in text. Under no
        session id, so it neither takes the conversation's replica slot nor replaces the KV
        prefix the conversation's next turn resumes from."""
        asked_for = self.transcription.instruction("transcribe", asked.language, asked.prompt)
        body = ChatCompletionRequest.model_validate(
            {
                "model": self.config.served_model_name,
                "messages": transcription_messages(pcm_to_wav_b64(pcm), "wav", asked_for),
                "stream": True,
                "max_tokens": transcript_budget(
                    len(pcm) / 2 / PCM_RATE, self.config.api.max_tokens_limit
                ),
                "temperature": 0.0,
                "modalities": ["text"],
            }
        )
        return await self._chat_events(body)

    async def _chat_events(
        self, body: ChatCompletionRequest, reply_room: int = 1
    ) -> AsyncIterator[ChatEvent]:
        start = time.perf_counter()
        prompt, options = await self.chat.prepare(body, reply_room)
        prepare_s = time.perf_counter() - start
        events = self.chat.events(prompt, options, uuid.uuid4().hex)
        return self.chat.observed(iterate_within(events, self.chat.deadline(body)), prepare_s)
