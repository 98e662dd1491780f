"""``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: OpenAI's form fields,
checked (a setting this server cannot honour is a 400 naming it, never an answer that ignores
it), and the answer in the shape asked for.

The clip arrives as a multipart file, as the ``openai`` client sends it; arrays come as
``name[]`` fields (its ``brackets`` form).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from omni_serve.api.errors import ApiError
from omni_serve.api.protocol import error_body
from omni_serve.api.sse import sse

# Formats with timestamps or speakers need what this model does not give.
_NEEDS_TIMESTAMPS = ("verbose_json", "srt", "vtt", "diarized_json")

# A transcript's default budget grows with the clip: Whisper's decoder writes at most 448
# tokens per 30 s window, about 15 a second, and speech runs well under that.
TRANSCRIPT_TOKENS_PER_SECOND = 16
TRANSCRIPT_MIN_TOKENS = 64


class TranslationForm(BaseModel):
    """The form of ``/v1/audio/translations``: a clip, into English text."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    file: UploadFile = Field(
        description="The clip: any file libsndfile reads (wav, flac, mp3, ogg), within the "
        "server's max_audio_bytes and max_audio_seconds."
    )
    model: str = Field(description="Served model id.")
    prompt: str | None = Field(
        None, max_length=2000, description="Text that guides the result: context, spellings."
    )
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt", "diarized_json"] = Field(
        "json", description="json or text; the formats with timestamps are a 400."
    )
    temperature: float = Field(0.0, ge=0.0, le=1.0, description="Sampling temperature, 0-1.")
    max_completion_tokens: int | None = Field(
        None,
        ge=1,
        description="vLLM's extension: most tokens of text. When absent, 16 a second of "
        "the clip (at least 64), within the server's max_tokens_limit.",
    )

    def unsupported(self) -> tuple[str, str] | None:
        """(param, reason) of a setting this server cannot honour."""
        if self.response_format in _NEEDS_TIMESTAMPS:
            reason = f"{self.response_format} needs timestamps, which this model does not give"
            return "response_format", f"{reason}; use json or text"
        return None


class TranscriptionForm(TranslationForm):
    """The form of ``/v1/audio/transcriptions``: a clip, into text in its own language."""

    language: str | None = Field(
        None, description="The clip's language (ISO 639-1); found by the model when absent."
    )
    stream: bool = Field(
        False, description="Stream the text as transcript.text.delta events (SSE)."
    )
    timestamp_granularities: list[str] = Field(
        default_factory=list,
        alias="timestamp_granularities[]",
        description="Not offered (no timestamps): any is a 400.",
    )
    include: list[str] = Field(
        default_factory=list,
        alias="include[]",
        description="Not offered (no logprobs): any is a 400.",
    )

    def unsupported(self) -> tuple[str, str] | None:
        if self.timestamp_granularities:
            return "timestamp_granularities", "this model does not give timestamps"
        if self.include:
            return "include", "this server does not return logprobs"
        if self.stream and self.response_format != "json":
            return "response_format", "a streamed transcription is json events"
        return super().unsupported()


def refuse_unsupported_form(form: TranslationForm) -> None:
    unsupported = form.unsupported()
    if unsupported:
        raise ApiError(400, unsupported[1], unsupported[0])


def transcript_budget(seconds: float | None, limit: int) -> int:
    """The most tokens a transcript of ``seconds`` of audio gets when the client names none.
    A model that loops (or random weights, which never end) stops near the clip's length
    instead of running to the server's limit; a clip of unknown length gets the limit."""
    if seconds is None:
        return limit
    return min(limit, max(TRANSCRIPT_MIN_TOKENS, round(seconds * TRANSCRIPT_TOKENS_PER_SECOND)))


def usage_tokens(prompt_tokens: int, text_tokens: int) -> dict[str, Any]:
    """OpenAI's token usage of a transcription (``type: tokens``)."""
    return {
        "type": "tokens",
        "input_tokens": prompt_tokens,
        "output_tokens": text_tokens,
        "total_tokens": prompt_tokens + text_tokens,
    }


def transcription_response(text: str, usage: dict[str, Any], fmt: str) -> Response:
    if fmt == "text":
        return PlainTextResponse(text)
    return JSONResponse({"text": text, "usage": usage})


class TranscriptWriter:
    """The events of a streamed transcription, as OpenAI's client reads them: the text as
    ``transcript.text.delta`` events, then ``transcript.text.done`` with the whole text and
    the usage (``omni_serve.api.sse`` says how a writer is driven)."""

    def start(self) -> list[str]:
        return []

    def event(self, event: Any) -> list[str]:
        if event.kind == "text" and event.text:
            return [sse({"type": "transcript.text.delta", "delta": event.text})]
        if event.kind == "done":
            result = event.result
            usage = usage_tokens(result.prompt_tokens, len(result.token_ids))
            return [sse({"type": "transcript.text.done", "text": result.text, "usage": usage})]
        return []

    def error(self, message: str, type_: str = "server_error") -> str:
        return sse({"type": "error", **error_body(message, type_)})
