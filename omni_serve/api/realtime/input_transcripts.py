"""Transcripts of a Realtime session's committed user audio (``audio.input.transcription``).

The served model transcribes (its Thinker hears the clip and is asked for its words, as for
``/v1/audio/transcriptions``): there is no separate ASR model. Each committed turn is
transcribed in the background, beside its answer, as OpenAI's do: its
``conversation.item.input_audio_transcription.delta`` events, then ``.completed`` with the
transcript and usage (or ``.failed`` with why), may come before, among or after the answer's
events. The transcript is kept on the item's audio part, so later events that show the item
(``conversation.item.retrieve``) carry it. It never changes what the model hears: the answer
hears the audio itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING

from omni_serve.api.errors import ApiError, stage_failure
from omni_serve.api.realtime.conversation import Item
from omni_serve.api.realtime.protocol import InputTranscription
from omni_serve.api.transcriptions import usage_tokens

if TYPE_CHECKING:
    from omni_serve.api.realtime.answer import ReplyEvent

log = logging.getLogger("ray.serve")

# (the clip as PCM16 mono 24 kHz, the session's settings) -> the text answer's events
Transcribe = Callable[[bytes, InputTranscription], Awaitable[AsyncIterator["ReplyEvent"]]]
Emit = Callable[..., Awaitable[None]]


class InputTranscripts:
    """The session's transcriptions in flight; ``close`` stops them all (in every stage)."""

    def __init__(self, transcribe: Transcribe | None, emit: Emit) -> None:
        self.transcribe, self.emit = transcribe, emit
        self._running: set[asyncio.Task] = set()

    def start(self, item: Item, settings: InputTranscription) -> None:
        """Transcribes ``item``'s audio parts in the background."""
        if self.transcribe is None:
            return
        for index, part in enumerate(item.parts):
            if part.type == "input_audio" and part.pcm:
                task = asyncio.create_task(self._run(item, index, settings))
                self._running.add(task)
                task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the client left mid-send
            log.info("realtime input transcription ended: %r", task.exception())

    async def close(self) -> None:
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _run(self, item: Item, index: int, settings: InputTranscription) -> None:
        part = item.parts[index]
        where = {"item_id": item.id, "content_index": index}
        kind = "conversation.item.input_audio_transcription"
        text, result = [], None
        try:
            events = await self.transcribe(part.pcm, settings)
            async with aclosing(events):
                async for event in events:
                    if event.kind == "text" and event.text:
                        text.append(event.text)
                        await self.emit(f"{kind}.delta", **where, delta=event.text)
                    elif event.kind == "done":
                        result = event.result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            refused = exc if isinstance(exc, ApiError) else stage_failure(exc)
            if not isinstance(exc, ApiError):
                log.exception("realtime input transcription failed")
            error = {k: v for k, v in refused.body["error"].items() if k != "event_id"}
            await self.emit(f"{kind}.failed", **where, error=error)
            return
        part.transcript = "".join(text)
        usage = usage_tokens(result.prompt_tokens, len(result.token_ids)) if result else None
        await self.emit(f"{kind}.completed", **where, transcript=part.transcript, usage=usage)
