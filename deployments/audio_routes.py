"""The omni ingress's audio routes: speech (text to speech) and transcriptions and
translations (speech to text), OpenAI's ``/v1/audio/*``. The voice WebSocket is
``voice_socket_routes.py``.

A mixin of ``OmniIngress``: the routes run through its chat path (``self.chat``, an
``OmniChat``), so they only shape requests and answers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

import numpy as np
from fastapi import Form
from fastapi.responses import Response, StreamingResponse

from deployments import handle_calls
from deployments.omni_api import app
from deployments.omni_chat import OmniChat, outcome
from omni_serve.api.deadline import RequestTimeout, await_within
from omni_serve.api.errors import ApiError, check_model, stage_failure
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.sse import sse
from omni_serve.api.transcriptions import (
    TranscriptionForm,
    TranscriptWriter,
    TranslationForm,
    refuse_unsupported_form,
    transcript_budget,
    transcription_response,
    usage_tokens,
)
from omni_serve.config import PipelineConfig
from omni_serve.media.audio_codec import STREAMABLE_FORMATS, encode_audio, wav_stream_header
from omni_serve.media.decode import audio_header
from omni_serve.models.thinker_talker.chat_flow import ChatEvent
from omni_serve.models.thinker_talker.family import SAMPLE_RATE
from omni_serve.models.thinker_talker.transcribe_prompt import (
    TranscriptionPrompt,
    transcription_messages,
)
from omni_serve.observability.metrics import ApiMetrics

log = logging.getLogger("ray.serve")

SPEECH_MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}


# The form field a transcription's chat field came from (its clip, the file: every
# "messages..." field).
_FORM_FIELDS = {"max_tokens": "max_completion_tokens"}


class AudioRoutes:
    config: PipelineConfig
    chat: OmniChat
    metrics: ApiMetrics
    transcription: TranscriptionPrompt  # the family's

    @app.post("/v1/audio/speech")
    async def speech(self, body: SpeechRequest) -> Response:
        """Text to speech: the Talker speaks ``input`` as the reply to it."""
        self.chat.check_speech(body, "model")
        fmt = "pcm16" if body.response_format == "pcm" else body.response_format
        if body.stream_format and fmt not in STREAMABLE_FORMATS:
            # SSE deltas are PCM16 (docs/api.md): an mp3 asked for would silently be PCM.
            message = f"streamed audio must be wav or pcm (stream_format {body.stream_format!r})"
            raise ApiError(400, message, "response_format")
        if body.stream_format and body.speed != 1.0:
            raise ApiError(400, "speed other than 1.0 is not supported when streaming", "speed")
        media_type = SPEECH_MEDIA_TYPES[body.response_format]
        if body.stream_format == "audio":
            events = await self.chat.speech_events(body)
            first = await self._until_audio(events)
            return StreamingResponse(self._speech_bytes(first, events, fmt), media_type=media_type)
        if body.stream_format == "sse":
            events = await self.chat.speech_events(body)
            return StreamingResponse(self._speech_sse(events), media_type="text/event-stream")

        async def spoken() -> np.ndarray:
            async for event in await self.chat.speech_events(body, deadline=False):
                if event.kind == "done":
                    return event.result.audio
            return np.zeros(0, dtype=np.float32)

        try:
            with self.chat.in_flight():
                audio = await await_within(
                    handle_calls.rerun_after_replica_death(spoken), self.chat.deadline(body)
                )
        except RequestTimeout as exc:
            self.metrics.requests.labels("timeout").inc()
            raise ApiError(504, str(exc), "timeout_s", type_="timeout_error") from None
        except Exception as exc:
            log.exception("speech request failed in a stage")
            failure = stage_failure(exc)
            self.metrics.requests.labels(outcome(failure)).inc()
            raise failure from None
        self.metrics.requests.labels("ok").inc()
        data = await asyncio.to_thread(encode_audio, audio, SAMPLE_RATE, fmt, body.speed)
        return Response(data, media_type=media_type)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(self, form: Annotated[TranscriptionForm, Form()]) -> Response:
        """Speech to text: the Thinker hears the clip and is asked for its words."""
        if form.language and (why := self.transcription.unknown_language(form.language)):
            raise ApiError(400, why, "language")
        asked = self.transcription.instruction("transcribe", form.language, form.prompt)
        return await self._transcribe(form, asked, form.stream)

    @app.post("/v1/audio/translations")
    async def translations(self, form: Annotated[TranslationForm, Form()]) -> Response:
        """Speech to English text."""
        asked = self.transcription.instruction("translate", None, form.prompt)
        return await self._transcribe(form, asked)

    async def _transcribe(
        self, form: TranslationForm, asked: str, stream: bool = False
    ) -> Response:
        """The clip and what to do with it, as a chat the Thinker answers in text."""
        check_model(form.model, self.config.served_model_name)
        refuse_unsupported_form(form)
        raw = await form.file.read()
        clip = await asyncio.to_thread(base64.b64encode, raw)
        # A file upload names no format; its length sets the default budget.
        fmt, seconds = await asyncio.to_thread(audio_header, raw)
        max_tokens = form.max_completion_tokens or transcript_budget(
            seconds, self.config.api.max_tokens_limit
        )
        body = ChatCompletionRequest(
            model=form.model,
            messages=transcription_messages(clip.decode(), fmt or "wav", asked),
            stream=stream,
            temperature=form.temperature,
            max_tokens=max_tokens,
        )
        try:
            prompt, options = await self.chat.prepare(body)
        except ApiError as exc:  # named as the chat's fields: name the form's instead
            param = exc.param or ""
            field = "file" if param.startswith("messages") else _FORM_FIELDS.get(param)
            if field is None:
                raise
            message = exc.message.replace(param, field)
            raise ApiError(
                exc.status, message, field, exc.type, exc.body["error"]["code"]
            ) from None
        if stream:
            answer = self.chat.sse(body, prompt, options, uuid.uuid4().hex, TranscriptWriter())
            return StreamingResponse(answer, media_type="text/event-stream")
        result = await self.chat.complete(body, prompt, options)
        self.metrics.observe_result(result.timings, len(result.token_ids), 0.0)
        self.metrics.requests.labels("ok").inc()
        usage = usage_tokens(result.prompt_tokens, len(result.token_ids))
        return transcription_response(result.text, usage, form.response_format)

    async def _until_audio(self, events: AsyncIterator[ChatEvent]) -> list[ChatEvent]:
        """The events up to the first audio chunk, before any byte is sent: a deadline or a
        stage failure before it is an error response (504, 503) instead of a 200 whose body
        breaks off (raw audio has no way to say why)."""
        taken = []
        try:
            async for event in events:  # leaving the loop leaves the generator open
                taken.append(event)
                if event.kind in ("audio", "done"):
                    break
        except RequestTimeout as exc:
            raise ApiError(504, str(exc), "timeout_s", type_="timeout_error") from None
        except ApiError:
            raise
        except Exception as exc:
            log.exception("streamed speech request failed in a stage")
            raise stage_failure(exc) from None
        return taken

    async def _speech_bytes(
        self, first: list[ChatEvent], events: AsyncIterator[ChatEvent], fmt: str
    ) -> AsyncIterator[bytes]:
        """The audio as it comes. Past the deadline the stream ends with the audio so far
        (the client's own limit; ``stream_format: sse`` says so in an event)."""
        if fmt == "wav":
            yield wav_stream_header(SAMPLE_RATE)
        for event in first:
            if event.kind == "audio":
                yield encode_audio(event.audio, SAMPLE_RATE, "pcm16")
        try:
            async with contextlib.aclosing(events):  # a client gone stops the stages at once
                async for event in events:
                    if event.kind == "audio":
                        yield encode_audio(event.audio, SAMPLE_RATE, "pcm16")
        except RequestTimeout as exc:
            log.info("streamed speech ended at its deadline: %s", exc)

    async def _speech_sse(self, events: AsyncIterator[ChatEvent]) -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(events):  # a client gone stops the stages
                async for event in events:
                    if event.kind == "audio":
                        data = base64.b64encode(encode_audio(event.audio, SAMPLE_RATE, "pcm16"))
                        yield sse({"type": "speech.audio.delta", "audio": data.decode()})
                    elif event.kind == "done":
                        seconds = len(event.result.audio) / SAMPLE_RATE
                        yield sse(
                            {
                                "type": "speech.audio.done",
                                "audio_seconds": seconds,
                                "timings": event.result.timings,
                            }
                        )
        except Exception as exc:  # headers are out: report in-band
            log.exception("streamed speech request failed in a stage")
            failure = stage_failure(exc)
            yield sse({"type": "error", "error": failure.body["error"]})
