"""One Realtime answer: the chat's events as OpenAI's response events, in OpenAI's order
(created, output item and content part added, deltas, their done events, ``response.done``),
and the assistant item it leaves in the conversation.

A stopped answer (``response.cancel``, or barge-in) ends with ``response.done`` saying
``cancelled`` and why; leaving the chat's event stream closes it, which stops the answer in
every stage. On barge-in the item keeps only what the client had played: the audio sent,
bounded by the time since its first delta (a client plays as it receives).

An answer's first audio may be held back (the session's ``start_cushion_s``): on a loaded
server the first frames of concurrent answers come slower than real time, and a client that
plays on arrival then falls silent mid-sentence. Held audio goes out as one delta once it
reaches the cushion, or when the answer ends; an answer stopped before that sends none.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
import uuid
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from omni_serve.api.errors import ApiError, stage_failure
from omni_serve.api.realtime.conversation import BYTES_PER_MS, Conversation, Item, Part
from omni_serve.api.realtime.protocol import PCM_RATE
from omni_serve.api.realtime.settings import Ask
from omni_serve.media.audio_codec import encode_audio

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from omni_serve.api.realtime.session import RealtimeSession, Respond

log = logging.getLogger("ray.serve")


class ReplyEvent(Protocol):
    """A chat's event as the deployment's chat path yields it."""

    kind: str  # "text", "audio" or "done"
    text: str
    audio: np.ndarray | None  # float32 mono at 24 kHz
    result: Any  # on "done": prompt_tokens, token_ids, cached_tokens, finish_reason, timings


_END = object()


class _Prefetch:
    """An answer's events, taken as the stages make them while the answer is not yet shown;
    ``aclose`` stops the stages (the chat stream is closed under ``aclosing``)."""

    def __init__(self, respond: Callable[[Ask], Awaitable[AsyncIterator[Any]]], ask: Ask) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump(respond, ask))

    async def _pump(self, respond: Respond, ask: Ask) -> None:
        try:
            events = await respond(ask)
            async with aclosing(events):
                async for event in events:
                    self._queue.put_nowait(event)
        except Exception as exc:  # shown once the answer is: a failed response
            self._queue.put_nowait(exc)
        else:
            self._queue.put_nowait(_END)

    async def events(self) -> AsyncIterator[Any]:
        while (item := await self._queue.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            yield item

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Answer:
    def __init__(
        self,
        session: RealtimeSession,
        ask: Ask,
        conversation: Conversation | None,
        metadata: dict[str, str] | None,
        gate: asyncio.Event | None = None,
    ) -> None:
        self.session, self.ask, self.conversation, self.metadata = (
            session,
            ask,
            conversation,
            metadata,
        )
        # An early answer runs unseen until its gate opens (the user's turn ended); stopped
        # before that, it leaves no trace.
        self.gate = gate
        self.id = f"resp_{uuid.uuid4().hex[:20]}"
        self.part = Part("output_audio" if ask.audio else "output_text", text="", transcript="")
        self.item = Item("assistant", [self.part], status="in_progress")
        self.reason: str | None = None  # why it was stopped
        self._opened = False
        self._previous: str | None = None
        self._first_audio_at: float | None = None
        self._held = bytearray()  # audio not yet sent: the start cushion

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.session.cancel_answer()

    def playback_left_s(self) -> float:
        """How long a client that plays the audio as it comes still has to play."""
        if self._first_audio_at is None:
            return 0.0
        sent_s = len(self.part.pcm) / BYTES_PER_MS / 1000
        return max(0.0, self._first_audio_at + sent_s - time.monotonic())

    def played_ms(self) -> int:
        if self._first_audio_at is None:
            return 0
        sent = len(self.part.pcm) // BYTES_PER_MS
        return min(sent, int((time.monotonic() - self._first_audio_at) * 1000))

    async def run(self, respond: Callable[[Ask], Awaitable[AsyncIterator[Any]]]) -> None:
        prefetch = None
        if self.gate is not None:
            prefetch = _Prefetch(respond, self.ask)
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                await prefetch.aclose()
                raise
        try:
            await self._shown(respond, prefetch)
        finally:
            if prefetch is not None:
                await prefetch.aclose()

    async def _shown(self, respond: Respond, prefetch: _Prefetch | None) -> None:
        session = self.session
        self._shown_at = time.monotonic()
        await session.emit("response.created", response=self.response_json("in_progress"))
        status, details, result = "completed", None, None
        try:
            events = prefetch.events() if prefetch else await respond(self.ask)
            await self._open()
            async with aclosing(events):  # also when cancelled: the stages stop at once
                async for event in events:
                    if event.kind == "done":
                        result = event.result
                    else:
                        await self._delta(event)
            await self._send_held()
        except asyncio.CancelledError:
            if session.gone:
                raise
            if prefetch is not None:
                await prefetch.aclose()  # the stages stop now, not after the events below
            status, details = "cancelled", {"type": "cancelled", "reason": self.reason}
            if self.reason == "turn_detected" and self.part.pcm:
                played = self.played_ms()
                if self.item.truncate(played):
                    await session.emit(
                        "conversation.item.truncated",
                        item_id=self.item.id,
                        content_index=0,
                        audio_end_ms=played,
                    )
        except Exception as exc:
            await self._send_held()  # made before the failure: the client gets it
            failure = exc if isinstance(exc, ApiError) else stage_failure(exc)
            if not isinstance(exc, ApiError):
                log.exception("realtime answer failed in a stage")
            await session.send(session.refusal(failure))
            status, details = "failed", {"type": "failed", "error": failure.body["error"]}
        if result is not None and result.finish_reason == "length":
            status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        if self._opened:
            await self._close(status)
        usage = _usage(result) if result is not None else None
        timings = result.timings if result is not None else self._own_timings()
        response = self.response_json(status, details, usage, timings)
        await session.emit("response.done", response=response)

    def _own_timings(self) -> dict[str, float] | None:
        """An answer stopped before the stages' timings came (barge-in, cancel): what the
        session itself saw, from response.created, so a client still gets its first-audio
        time and pace."""
        if self._first_audio_at is None:
            return None
        total = time.monotonic() - self._shown_at
        audio_s = len(self.part.pcm) / BYTES_PER_MS / 1000
        timings = {"first_audio_s": self._first_audio_at - self._shown_at, "total_s": total}
        return {**timings, "rtf": total / audio_s} if audio_s > 0 else timings

    def response_json(
        self,
        status: str,
        details: dict | None = None,
        usage: dict | None = None,
        timings: dict | None = None,
    ) -> dict[str, Any]:
        """OpenAI's response object (``timings``: omni-serve's per-stage times, as chat's)."""
        shown = {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [self.item.as_json()] if self._opened else [],
            "conversation_id": "auto" if self.conversation is not None else None,
            "output_modalities": ["audio" if self.ask.audio else "text"],
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": PCM_RATE},
                    "voice": self.ask.voice,
                }
            },
            "max_output_tokens": self.ask.max_tokens,
            "metadata": self.metadata,
            "usage": usage,
        }
        if timings is not None:
            shown["timings"] = timings
        return shown

    def _where(self) -> dict[str, Any]:
        return {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
        }

    async def _open(self) -> None:
        session, self._opened = self.session, True
        if self.conversation is not None:
            self._previous = self.conversation.add(self.item, checked=False)
        await session.emit(
            "response.output_item.added",
            response_id=self.id,
            output_index=0,
            item=self.item.as_json(),
        )
        if self.conversation is not None:
            await session.emit(
                "conversation.item.added", item=self.item.as_json(), previous_item_id=self._previous
            )
        await session.emit("response.content_part.added", **self._where(), part=self._part_json())

    def _part_json(self) -> dict[str, Any]:
        if self.ask.audio:
            return {"type": "audio", "transcript": self.part.transcript}
        return {"type": "text", "text": self.part.text}

    async def _delta(self, event: Any) -> None:
        session, where = self.session, self._where()
        if event.kind == "text" and self.ask.audio:
            self.part.transcript += event.text
            await session.emit("response.output_audio_transcript.delta", **where, delta=event.text)
        elif event.kind == "text":
            self.part.text += event.text
            await session.emit("response.output_text.delta", **where, delta=event.text)
        elif event.kind == "audio":
            pcm = encode_audio(event.audio, PCM_RATE, "pcm16")
            if self._first_audio_at is None:
                self._held += pcm
                if len(self._held) / BYTES_PER_MS / 1000 < session.start_cushion_s():
                    return
                await self._send_held()
            else:
                await self._send_audio(pcm)

    async def _send_held(self) -> None:
        if self._held:
            pcm, self._held = bytes(self._held), bytearray()
            await self._send_audio(pcm)

    async def _send_audio(self, pcm: bytes) -> None:
        self.part.pcm += pcm
        await self.session.emit(
            "response.output_audio.delta", **self._where(), delta=base64.b64encode(pcm).decode()
        )
        if self._first_audio_at is None:
            self._first_audio_at = time.monotonic()

    async def _close(self, status: str) -> None:
        session, where = self.session, self._where()
        if self.item.status == "in_progress":
            self.item.status = "completed" if status == "completed" else "incomplete"
        if self.ask.audio:
            await session.emit("response.output_audio.done", **where)
            await session.emit(
                "response.output_audio_transcript.done", **where, transcript=self.part.transcript
            )
        else:
            await session.emit("response.output_text.done", **where, text=self.part.text)
        await session.emit("response.content_part.done", **where, part=self._part_json())
        shown = self.item.as_json()
        await session.emit(
            "response.output_item.done", response_id=self.id, output_index=0, item=shown
        )
        if self.conversation is not None:
            await session.emit(
                "conversation.item.done", item=shown, previous_item_id=self._previous
            )


def _usage(result: Any) -> dict[str, Any]:
    prompt, output = result.prompt_tokens, len(result.token_ids)
    return {
        "total_tokens": prompt + output,
        "input_tokens": prompt,
        "output_tokens": output,
        "input_token_details": {"cached_tokens": result.cached_tokens},
        "output_token_details": {"text_tokens": output},
    }
