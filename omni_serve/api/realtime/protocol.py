"""OpenAI's Realtime API (GA) as this server speaks it: the client events it takes, the
session settings they carry, and the server events' shapes.

Field names and event types are OpenAI's, so its clients work unchanged. What Qwen3-Omni
cannot do (tools, a separate transcription model, semantic VAD, G.711 audio, noise
reduction) is accepted as a field and refused with a reason (``unsupported``), never
silently ignored. Audio is PCM16 mono at 24 kHz in both directions, as OpenAI's ``audio/pcm``.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omni_serve.api.errors import ApiError
from omni_serve.api.validation_errors import most_specific

PCM_RATE = 24_000  # OpenAI's audio/pcm: 16-bit mono little-endian at 24 kHz


def event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


def item_id() -> str:
    return f"item_{uuid.uuid4().hex[:20]}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Strict):
    type: str = Field("audio/pcm", description="audio/pcm (PCM16 mono); G.711 is refused.")
    rate: int = Field(PCM_RATE, description="Sample rate; audio/pcm is 24000 Hz.")


class TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"] = Field(
        description="server_vad: silero-vad on the server; semantic_vad is refused."
    )
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="Speech probability to start.")
    silence_duration_ms: int = Field(
        500, ge=0, le=10_000, description="Silence that ends the user's turn."
    )
    prefix_padding_ms: int = Field(
        300, ge=0, le=5_000, description="Audio kept from before speech was detected."
    )
    create_response: bool = Field(True, description="Answer by itself when the turn ends.")
    interrupt_response: bool = Field(
        True, description="Speech during an answer stops it (barge-in)."
    )
    idle_timeout_ms: int | None = Field(
        None,
        ge=100,
        le=600_000,
        description="After an answer's audio has played, silence this long commits the buffer "
        "and answers again (input_audio_buffer.timeout_triggered); null: wait for the user.",
    )
    eagerness: str | None = Field(None, description="semantic_vad only: refused with it.")


class InputTranscription(_Strict):
    """``audio.input.transcription``: the served model transcribes each committed turn."""

    model: str | None = Field(
        None, description="The served model (it transcribes); another name is refused."
    )
    language: str | None = Field(None, description="The speech's language (ISO 639-1), a hint.")
    prompt: str | None = Field(None, description="Context or spellings, told after the clip.")
    delay: str | None = Field(None, description="Not offered: must be null.")
    languages: list[str] | None = Field(None, description="Not offered: send language.")
    keywords: list[str] | None = Field(None, description="Not offered: put them in prompt.")


class AudioInput(_Strict):
    format: AudioFormat | None = Field(None, description="The input audio's encoding.")
    turn_detection: TurnDetection | None = Field(
        None, description="server_vad, or null to commit and answer by client events only."
    )
    transcription: InputTranscription | None = Field(
        None, description="Transcripts of the user's committed audio, or null for none."
    )
    noise_reduction: dict[str, Any] | None = Field(
        None, description="Noise reduction: not offered (must be null)."
    )


class AudioOutput(_Strict):
    format: AudioFormat | None = Field(None, description="The output audio's encoding.")
    voice: str | None = Field(None, description="One of the model's voices.")
    speed: float = Field(1.0, description="Only 1.0: the model speaks at one speed.")


class AudioConfig(_Strict):
    input: AudioInput | None = Field(None, description="Input audio settings.")
    output: AudioOutput | None = Field(None, description="Output audio settings.")


class TokenLimits(_Strict):
    post_instructions: int | None = Field(None, description="Not offered: must be null.")


class RetentionRatio(_Strict):
    """OpenAI's ``retention_ratio`` truncation: cut deeper than needed, so that the next
    turns fit without a cut (each cut changes the prompt's start, and with it the KV prefix
    the next turn would resume from)."""

    type: Literal["retention_ratio"]
    retention_ratio: float = Field(
        gt=0.0, le=1.0, description="The share of what fits that a cut leaves in the context."
    )
    token_limits: TokenLimits | None = None


class SessionUpdate(_Strict):
    """``session.update``'s ``session``: only the fields a client sends change."""

    type: Literal["realtime"] = Field("realtime", description="Only realtime sessions.")
    model: str | None = Field(None, description="The served model; another is refused.")
    instructions: str | None = Field(None, description="The system prompt of every answer.")
    output_modalities: list[Literal["text", "audio"]] | None = Field(
        None, min_length=1, max_length=1, description="['audio'] (with a transcript) or ['text']."
    )
    audio: AudioConfig | None = Field(None, description="Input and output audio settings.")
    max_output_tokens: int | Literal["inf"] | None = Field(
        None, description="Most text tokens per answer; inf = the server's limit."
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="omni-serve extension: the Thinker's temperature."
    )
    seed: int | None = Field(
        None, description="omni-serve extension: the same seed reproduces an answer, speech too."
    )
    tools: list[dict[str, Any]] | None = Field(None, description="Not offered: must be empty.")
    tool_choice: Any = Field(None, description="Only 'auto' or 'none' (no tools are offered).")
    include: list[str] | None = Field(
        None, description="Not offered (no transcription logprobs): must be empty."
    )
    tracing: Any = Field(None, description="Accepted and ignored: no tracing here.")
    truncation: Literal["auto", "disabled"] | RetentionRatio | None = Field(
        None,
        description="What an answer does when the conversation outgrows the model's context "
        "(less the answer's max_output_tokens): 'auto' (the default) leaves the oldest items "
        "out of the model's context until it fits; a retention_ratio leaves out enough that "
        "only that share of what fits is used, so the next turns fit too; 'disabled' fails "
        "the answer instead.",
    )
    prompt: Any = Field(None, description="Stored prompts: not offered (must be null).")


class ContentPart(_Strict):
    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = Field(None, description="Base64 PCM16 mono 24 kHz.")
    transcript: str | None = None


class ItemIn(_Strict):
    """``conversation.item.create``'s ``item``: a message (function calls are refused)."""

    type: Literal["message", "function_call", "function_call_output"] = "message"
    id: str | None = Field(None, max_length=64)
    object: Literal["realtime.item"] | None = None
    status: str | None = None
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
    # function_call items' fields: named, so the refusal says what is not offered
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class ResponseOptions(_Strict):
    """``response.create``'s ``response``: this answer's settings over the session's."""

    instructions: str | None = None
    output_modalities: list[Literal["text", "audio"]] | None = Field(
        None, min_length=1, max_length=1
    )
    audio: AudioConfig | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    seed: int | None = None
    conversation: Literal["auto", "none"] = "auto"
    input: list[ItemIn] | None = None
    metadata: dict[str, str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    prompt: Any = None


class _Event(_Strict):
    event_id: str | None = Field(None, max_length=128)


class SessionUpdateEvent(_Event):
    type: Literal["session.update"]
    session: SessionUpdate


class AppendEvent(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class CommitEvent(_Event):
    type: Literal["input_audio_buffer.commit"]


class ClearEvent(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreateEvent(_Event):
    type: Literal["conversation.item.create"]
    item: ItemIn
    previous_item_id: str | None = None


class ItemDeleteEvent(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ItemRetrieveEvent(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ItemTruncateEvent(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = 0
    audio_end_ms: int = Field(ge=0)


class ResponseCreateEvent(_Event):
    type: Literal["response.create"]
    response: ResponseOptions | None = None


class ResponseCancelEvent(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputClearEvent(_Event):
    type: Literal["output_audio_buffer.clear"]


ClientEvent = Annotated[
    SessionUpdateEvent
    | AppendEvent
    | CommitEvent
    | ClearEvent
    | ItemCreateEvent
    | ItemDeleteEvent
    | ItemRetrieveEvent
    | ItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | OutputClearEvent,
    Field(discriminator="type"),
]
_EVENTS: TypeAdapter[Any] = TypeAdapter(ClientEvent)


def parse_client_event(raw: Any) -> Any:
    """The client event ``raw`` is; a 400 naming its most specific bad field otherwise."""
    try:
        return _EVENTS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            sent = first.get("input")
            kind = sent.get("type") if isinstance(sent, dict) else None
            raise ApiError(
                400, f"unknown event type {kind!r}", "type", code="unknown_event"
            ) from None
        error = most_specific(exc.errors(), skip=1)  # loc[0] is the event's type tag
        raise ApiError(400, error.message, error.param) from None


def unsupported(update: SessionUpdate | ResponseOptions) -> tuple[str, str] | None:
    """(param, reason) of a setting Qwen3-Omni cannot honour, ``None`` when it can."""
    if update.tools:
        return "tools", "this model does not call tools"
    if update.tool_choice not in (None, "auto", "none"):
        return "tool_choice", "only 'auto' or 'none': this model does not call tools"
    if update.prompt is not None:
        return "prompt", "stored prompts are not offered; send instructions"
    if getattr(update, "include", None):
        return "include", "this server does not return transcription logprobs"
    truncation = getattr(update, "truncation", None)
    limits = truncation.token_limits if isinstance(truncation, RetentionRatio) else None
    if limits is not None and limits.post_instructions is not None:
        reason = "not offered: the model's context, less the answer's max_output_tokens, is it"
        return "truncation.token_limits.post_instructions", reason
    audio = update.audio
    for where, side in (("input", audio and audio.input), ("output", audio and audio.output)):
        if side is None or side.format is None:
            continue
        if side.format.type != "audio/pcm" or side.format.rate != PCM_RATE:
            return f"audio.{where}.format", f"only audio/pcm at {PCM_RATE} Hz (PCM16 mono)"
    output = audio and audio.output
    if output is not None and output.speed != 1.0:
        return "audio.output.speed", "this model speaks at one speed (1.0)"
    heard = audio and audio.input
    asr = heard and heard.transcription
    for name in ("delay", "languages", "keywords"):
        if asr is not None and getattr(asr, name) is not None:
            return f"audio.input.transcription.{name}", "not offered (see language and prompt)"
    if heard is not None and heard.noise_reduction is not None:
        return "audio.input.noise_reduction", "noise reduction is not offered"
    vad = heard and heard.turn_detection
    if vad is not None and vad.type != "server_vad":
        return "audio.input.turn_detection.type", "only server_vad (or null)"
    return None
