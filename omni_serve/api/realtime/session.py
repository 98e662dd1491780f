"""One ``/v1/realtime`` connection: OpenAI's Realtime events in, the conversation and the
input audio buffer kept, answers streamed out; the connection itself is ``SocketSession``'s.

- Every client event is checked before it changes anything; a bad one is answered with an
  ``error`` event naming the field (and the client's ``event_id``), and the session goes on.
- With ``server_vad`` (the default, as OpenAI's), silero-vad hears the buffer as it fills:
  speech that stops for ``silence_duration_ms`` commits the buffer as a user item and starts
  an answer; speech that starts during an answer stops it in every stage (barge-in) and cuts
  the assistant item to what had been played (``Answer.played_ms``).
- Answers come from ``respond`` (the deployment's chat path): one at a time, each over the
  whole conversation, under the session's id, so turns keep to one Thinker replica and
  reuse its KV prefix.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import WebSocket

from omni_serve.api.errors import ApiError
from omni_serve.api.realtime.answer import Answer, ReplyEvent
from omni_serve.api.realtime.conversation import (
    BYTES_PER_MS,
    Conversation,
    Item,
    Part,
    item_from_client,
    pcm_from_b64,
)
from omni_serve.api.realtime.idle_prompt import IdlePrompt
from omni_serve.api.realtime.input_transcripts import InputTranscripts, Transcribe
from omni_serve.api.realtime.protocol import (
    AppendEvent,
    ClearEvent,
    CommitEvent,
    ItemCreateEvent,
    ItemDeleteEvent,
    ItemRetrieveEvent,
    ItemTruncateEvent,
    OutputClearEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    ResponseOptions,
    SessionUpdateEvent,
    event_id,
    parse_client_event,
)
from omni_serve.api.realtime.settings import Ask, Limits, Settings
from omni_serve.api.realtime.truncation import within_context
from omni_serve.api.realtime.turn_detection import SpeechEdge, VoiceActivity, load_vad_model
from omni_serve.api.socket_session import SocketSession

log = logging.getLogger("ray.serve")

Respond = Callable[[Ask], Awaitable[AsyncIterator[ReplyEvent]]]
MIN_COMMIT_MS = 100  # OpenAI's least audio a commit takes


class RealtimeSession(SocketSession):
    def __init__(
        self,
        ws: WebSocket,
        respond: Respond,
        limits: Limits,
        idle_timeout_s: float | None,
        max_buffer_bytes: int,
        early_answer_ms: int | None = None,
        transcribe: Transcribe | None = None,
        start_cushion_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        super().__init__(ws, idle_timeout_s)
        # Seconds of an answer's first audio to hold back, asked at each of its first chunks:
        # it grows with the server's load (``Answer``).
        self.start_cushion_s = start_cushion_s
        self.respond, self.limits, self.max_buffer_bytes = respond, limits, max_buffer_bytes
        self.early_answer_ms = early_answer_ms
        self.settings = Settings.initial(limits)
        self.conversation = Conversation(max_bytes=limits.conversation_bytes)
        self.buffer = bytearray()  # PCM16 24 kHz not yet committed
        self._buffer_end_ms = 0  # the session's audio time at the buffer's end
        self._vad: VoiceActivity | None = None
        self._speech_item: str | None = None  # the item id speech_started announced
        self._answer: Answer | None = None
        self._early: tuple[Answer, Item] | None = None  # an answer started before the turn end
        self._discarded: asyncio.Task | None = None  # an early answer's task winding down
        self._client_event: str | None = None  # the event being handled, for its errors
        self.transcripts = InputTranscripts(transcribe, self.emit)
        self._idle = IdlePrompt()  # server VAD's idle_timeout_ms after an answer

    async def run(self) -> None:
        """The session, until the client leaves or idles out."""
        if self.settings.vad is not None:
            model = await asyncio.to_thread(load_vad_model)
            # The reader runs meanwhile: a session.update may have turned turn detection off
            # (or set up its own) while the model loaded.
            if self.settings.vad is not None and self._vad is None:
                self._vad = VoiceActivity(self.settings.vad, model, self.early_answer_ms)
                self._vad.heard_ms = self._buffer_end_ms
        await self.emit("session.created", session=self.settings.as_json(self.limits))
        await self.until_idle_or_gone()

    async def close(self) -> None:
        self._idle.cancel()
        await super().close()
        await self.transcripts.close()

    async def emit(self, kind: str, **fields: Any) -> None:
        await self.send({"type": kind, "event_id": event_id(), **fields})

    def refusal(self, refused: ApiError) -> dict[str, Any]:
        error = {**refused.body["error"], "event_id": self._client_event}
        return {"type": "error", "event_id": event_id(), "error": error}

    async def take(self, message: dict[str, Any]) -> None:
        self._client_event = None
        if message.get("bytes") is not None:
            raise ApiError(400, "send audio as input_audio_buffer.append events (base64 PCM16)")
        try:
            raw = json.loads(message.get("text") or "")
        except ValueError as exc:
            raise ApiError(400, f"not JSON: {exc}") from None
        if isinstance(raw, dict) and isinstance(raw.get("event_id"), str):
            self._client_event = raw["event_id"]
        event = parse_client_event(raw)
        await getattr(self, "_on_" + event.type.replace(".", "_"))(event)

    # --- session and input audio -------------------------------------------------------

    async def _on_session_update(self, event: SessionUpdateEvent) -> None:
        new = self.settings.updated(event.session, self.limits)
        if new.vad != self.settings.vad:
            await self._discard_early()
            self._idle.cancel()
            old, self._vad = self._vad, None
            if new.vad is not None:
                model = old.model if old else await asyncio.to_thread(load_vad_model)
                self._vad = VoiceActivity(new.vad, model, self.early_answer_ms)
                self._vad.heard_ms = self._buffer_end_ms
        self.settings = new
        await self.emit("session.updated", session=new.as_json(self.limits))

    async def _on_input_audio_buffer_append(self, event: AppendEvent) -> None:
        pcm = pcm_from_b64(event.audio, "audio")
        if len(self.buffer) + len(pcm) > self.max_buffer_bytes:
            message = (
                f"the input audio buffer would pass {self.max_buffer_bytes} bytes "
                "(api.max_audio_bytes); commit or clear it"
            )
            raise ApiError(400, message, "audio", code="input_audio_buffer_full")
        self.buffer += pcm
        self._buffer_end_ms += len(pcm) // BYTES_PER_MS
        if self._vad is None:
            return
        for edge in await self._vad.hear_soon(pcm):
            await self._on_edge(edge)
        if not self._vad.speaking:  # keep only what a coming start would pad with
            keep = (self._vad.settings.prefix_padding_ms + 200) * BYTES_PER_MS
            del self.buffer[: max(0, len(self.buffer) - keep)]

    async def _on_edge(self, edge: SpeechEdge) -> None:
        vad = self._vad.settings
        if edge.kind == "quiet":
            if vad.create_response and not self.answering:
                self._start_early_answer()
            return
        if edge.kind == "resumed":
            await self._discard_early()
            return
        if edge.kind == "started":
            start = max(0, len(self.buffer) - (self._buffer_end_ms - edge.audio_ms) * BYTES_PER_MS)
            del self.buffer[:start]
            self._speech_item = Item("user", []).id
            self._idle.cancel()
            await self.emit(
                "input_audio_buffer.speech_started",
                audio_start_ms=edge.audio_ms,
                item_id=self._speech_item,
            )
            if vad.interrupt_response and self._answer is not None:
                self._answer.stop("turn_detected")
            return
        item_id, self._speech_item = self._speech_item, None
        await self.emit(
            "input_audio_buffer.speech_stopped", audio_end_ms=edge.audio_ms, item_id=item_id
        )
        if self._early is not None:  # its answer heard this turn: show both
            try:
                self.conversation.make_room(self._early[1])
            except ApiError:
                await self._discard_early()  # else it would wait unseen for good
                raise
            (answer, item), self._early = self._early, None
            self.buffer.clear()  # the silence since it started
            previous = self.conversation.add(item, checked=False)
            await self.emit(
                "input_audio_buffer.committed", item_id=item.id, previous_item_id=previous
            )
            await self._announce(item, previous)
            self._transcribe(item)
            answer.gate.set()
            return
        await self._commit(item_id)
        await self._until_discarded()
        if vad.create_response and not self.answering:
            await self._start_answer(None)

    async def _on_input_audio_buffer_commit(self, event: CommitEvent) -> None:
        await self._discard_early()
        await self._commit(self._speech_item)
        self._speech_item = None

    async def _commit(self, item_id: str | None, least_ms: int = MIN_COMMIT_MS) -> None:
        self._idle.cancel()
        if len(self.buffer) < least_ms * BYTES_PER_MS:
            message = (
                f"the input audio buffer holds {len(self.buffer) // BYTES_PER_MS} ms; "
                f"a commit takes at least {MIN_COMMIT_MS} ms"
            )
            raise ApiError(400, message, code="input_audio_buffer_commit_empty")
        item = Item("user", [Part("input_audio", pcm=bytes(self.buffer))])
        if item_id is not None:
            item.id = item_id
        previous = self.conversation.add(item)  # refused: the buffer stays, as it was
        self.buffer.clear()
        await self.emit("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        await self._announce(item, previous)
        self._transcribe(item)

    async def _on_idle(self) -> None:
        """The user stayed silent after an answer (``idle_timeout_ms``): what the buffer
        holds becomes the user's turn, and the model answers it."""
        vad = self._vad
        if vad is None or vad.speaking or self.answering or self.gone:
            return
        item_id, end_ms = Item("user", []).id, self._buffer_end_ms
        start_ms = max(0, end_ms - vad.settings.idle_timeout_ms)
        await self.emit(
            "input_audio_buffer.timeout_triggered",
            audio_start_ms=start_ms,
            audio_end_ms=end_ms,
            item_id=item_id,
        )
        await self._commit(item_id, least_ms=0)
        if vad.settings.create_response and not self.answering:
            await self._start_answer(None)

    def _transcribe(self, item: Item) -> None:
        if self.settings.transcription is not None:
            self.transcripts.start(item, self.settings.transcription)

    async def _on_input_audio_buffer_clear(self, event: ClearEvent) -> None:
        await self._discard_early()
        self.buffer.clear()
        await self.emit("input_audio_buffer.cleared")

    async def _on_output_audio_buffer_clear(self, event: OutputClearEvent) -> None:
        message = (
            "output_audio_buffer.clear is for WebRTC and SIP sessions; over a WebSocket "
            "send response.cancel and conversation.item.truncate"
        )
        raise ApiError(400, message, "type")

    # --- the conversation --------------------------------------------------------------

    async def _announce(self, item: Item, previous: str | None) -> None:
        """A finished item's events: OpenAI's GA pair, and the beta's ``created``."""
        shown = item.as_json()
        for kind in (
            "conversation.item.created",
            "conversation.item.added",
            "conversation.item.done",
        ):
            await self.emit(kind, item=shown, previous_item_id=previous)

    async def _on_conversation_item_create(self, event: ItemCreateEvent) -> None:
        item = item_from_client(event.item)
        await self._announce(item, self.conversation.add(item, event.previous_item_id))

    async def _on_conversation_item_delete(self, event: ItemDeleteEvent) -> None:
        self.conversation.delete(event.item_id)
        await self.emit("conversation.item.deleted", item_id=event.item_id)

    async def _on_conversation_item_retrieve(self, event: ItemRetrieveEvent) -> None:
        item = self.conversation.get(event.item_id)
        await self.emit("conversation.item.retrieved", item=item.as_json(audio=True))

    async def _on_conversation_item_truncate(self, event: ItemTruncateEvent) -> None:
        item = self.conversation.get(event.item_id)
        if item.role != "assistant":
            raise ApiError(400, "only an assistant's audio can be truncated", "item_id")
        item.truncate(event.audio_end_ms)
        await self.emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    # --- answers -----------------------------------------------------------------------

    async def _on_response_create(self, event: ResponseCreateEvent) -> None:
        await self._discard_early()  # the client asks instead: its answer, not one it never saw
        await self._until_discarded()
        if self.answering:
            raise ApiError(
                400,
                "a response is in progress: cancel it or wait for response.done",
                code="conversation_already_has_active_response",
            )
        await self._start_answer(event.response)

    async def _on_response_cancel(self, event: ResponseCancelEvent) -> None:
        answer = self._answer
        if answer is None or (event.response_id not in (None, answer.id)):
            raise ApiError(
                400,
                "no response in progress to cancel",
                "response_id",
                code="response_cancel_not_active",
            )
        answer.stop("client_cancelled")

    async def _start_answer(self, options: ResponseOptions | None) -> None:
        settings, keep, heard = self.settings, True, self.conversation
        if options is not None:
            settings = settings.updated(options, self.limits)
            keep = options.conversation == "auto"
            if options.input is not None:
                heard = Conversation([item_from_client(i) for i in options.input])
        audio_items = self.limits.audio_items
        ask = settings.ask(heard.messages(settings.instructions, audio_items))
        if not ask.messages:
            message = "nothing to answer: no instructions, and no item the model can hear"
            raise ApiError(
                400, message, "response.input" if heard is not self.conversation else None
            )
        if keep:
            self.conversation.make_room(Item("assistant", []))
        metadata = options.metadata if options else None
        respond = within_context(
            self.respond, heard, settings.instructions, audio_items, settings.kept_share()
        )
        self._launch(Answer(self, ask, self.conversation if keep else None, metadata), respond)

    def _start_early_answer(self) -> None:
        """Starts answering the speech so far, unseen (``Answer.gate``): the user has paused
        ``early_answer_ms``, so the turn may be ending. When the silence window completes
        the answer is shown, its first audio already made; speech that resumes discards it."""
        if len(self.buffer) < MIN_COMMIT_MS * BYTES_PER_MS:
            return
        item = Item("user", [Part("input_audio", pcm=bytes(self.buffer))])
        if self._speech_item is not None:
            item.id = self._speech_item
        s = self.settings
        # as the conversation will hear it once the turn is committed
        said = self.conversation
        turn = Conversation([*said.items, item], said.heard_from, said.context_from)
        ask = s.ask(turn.messages(s.instructions, self.limits.audio_items))
        answer = Answer(self, ask, said, None, gate=asyncio.Event())
        self._early = (answer, item)
        respond = within_context(
            self.respond, turn, s.instructions, self.limits.audio_items, s.kept_share(), said
        )
        self._launch(answer, respond)

    async def _discard_early(self) -> None:
        """Stops the early answer, if any (it shows nothing). Its stages wind down in the
        background: the reader must go on hearing the user meanwhile."""
        if self._early is not None:
            answer, _ = self._early
            self._early = None
            answer.stop("discarded")
            self._discarded = self._answering
            log.info("realtime %s: early answer discarded (the user spoke again)", self.settings.id)

    async def _until_discarded(self) -> None:
        """Waits for a discarded early answer still winding down (one answer at a time)."""
        if self._discarded is not None and not self._discarded.done():
            await asyncio.wait([self._discarded])
        self._discarded = None

    def _launch(self, answer: Answer, respond: Respond) -> None:
        self._idle.cancel()
        self._answer = answer
        task = self.start_answer(answer.run(respond))
        task.add_done_callback(lambda _: self._answer_done(answer))

    def _answer_done(self, answer: Answer) -> None:
        if self._answer is answer:
            self._answer = None
        if self._vad is not None and not self.gone:
            self._idle.after(answer, self._vad.settings, self._on_idle)
