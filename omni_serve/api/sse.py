"""Server-sent events in the OpenAI chat.completion.chunk shape.

A streamed answer is written by a writer with ``start()``, ``event(event)`` (one event of the
chat's stream: ``kind`` "text", "audio" or "done") and ``error(message, type)``; the
ingress's one streaming loop drives whichever the route needs (this one for chats,
``transcription.TranscriptWriter`` for transcriptions)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import numpy as np

from omni_serve.api.protocol import reply_usage
from omni_serve.media.audio_codec import encode_audio, wav_stream_header

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class ChunkWriter:
    """Builds the chunks of one streamed chat completion."""

    def __init__(
        self,
        completion_id: str,
        model: str,
        audio_id: str,
        sample_rate: int,
        audio_format: str,
        include_usage: bool = False,
        audio_expires_at: int | None = None,
    ) -> None:
        self.completion_id, self.model = completion_id, model
        self.audio_id, self.sample_rate, self.audio_format = audio_id, sample_rate, audio_format
        self.include_usage = include_usage
        self.created = int(time.time())
        self.audio_expires_at = self.created if audio_expires_at is None else audio_expires_at
        self._audio_started = False

    def start(self) -> list[str]:
        return [self.role()]

    def event(self, event: Any) -> list[str]:
        if event.kind == "text":
            return [self.text(event.text)]
        if event.kind == "audio":
            return [self.audio(event.audio)]
        result = event.result
        chunks = [self.finish(result.finish_reason, result.timings)]
        if self.include_usage:
            chunks.append(self.usage(reply_usage(result)))
        return chunks

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def role(self) -> str:
        return sse(self._chunk({"role": "assistant", "content": ""}))

    def text(self, delta: str) -> str:
        return sse(self._chunk({"content": delta}))

    def audio(self, samples: np.ndarray, transcript: str = "") -> str:
        data = encode_audio(samples, self.sample_rate, "pcm16")
        if self.audio_format == "wav" and not self._audio_started:
            data = wav_stream_header(self.sample_rate) + data
        self._audio_started = True
        audio = {
            "id": self.audio_id,
            "data": base64.b64encode(data).decode(),
            "expires_at": self.audio_expires_at,
            "transcript": transcript,
        }
        return sse(self._chunk({"audio": audio}))

    def finish(self, reason: str, timings: dict[str, float] | None = None) -> str:
        """The chunk with ``finish_reason``; it also carries the request's ``timings`` (an
        extension field OpenAI clients ignore): a streaming client has no response body."""
        chunk = self._chunk({}, finish_reason=reason)
        if timings is not None:
            chunk["timings"] = timings
        return sse(chunk)

    def usage(self, usage: dict[str, int]) -> str:
        chunk = self._chunk({})
        chunk["choices"] = []
        chunk["usage"] = usage
        return sse(chunk)

    def error(self, message: str, type_: str = "server_error") -> str:
        return sse({"error": {"message": message, "type": type_, "param": None, "code": None}})
