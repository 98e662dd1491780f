"""A Realtime session's settings as they stand after each ``session.update``, what one
answer asks the model for (``Ask``), and the session object its events show."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from omni_serve.api.errors import ApiError
from omni_serve.api.realtime.protocol import (
    PCM_RATE,
    InputTranscription,
    ResponseOptions,
    RetentionRatio,
    SessionUpdate,
    TurnDetection,
    unsupported,
)

PCM = {"type": "audio/pcm", "rate": PCM_RATE}


@dataclass(frozen=True)
class Ask:
    """One answer's request to the model, whatever the route that serves it."""

    messages: list[dict[str, Any]]
    audio: bool  # spoken (with its transcript) or text only
    voice: str
    max_tokens: int
    temperature: float
    seed: int | None
    session_id: str
    reply_room: int = 1  # context the prompt leaves free: max_tokens where a cut may follow


@dataclass(frozen=True)
class Limits:
    """What the deployment can do, to check settings against before anything runs."""

    model: str
    voices: frozenset[str]  # empty: the deployment has no Talker and answers in text
    max_tokens: int  # the most an answer may ask for
    default_tokens: int  # an answer's budget when the client sets none
    # the languages a transcription may name; empty: the deployment does not transcribe
    languages: frozenset[str] = frozenset()
    audio_items: int | None = None  # the most audio items one prompt takes (None: no limit)
    conversation_bytes: int | None = None  # the most a conversation holds (None: no limit)


@dataclass
class Settings:
    instructions: str | None = None
    audio: bool = True
    voice: str = "ethan"
    vad: TurnDetection | None = field(
        default_factory=lambda: TurnDetection(type="server_vad")  # OpenAI's default
    )
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    transcription: InputTranscription | None = None  # transcribe committed user audio
    truncation: Literal["auto", "disabled"] | RetentionRatio = "auto"  # OpenAI's default
    id: str = field(default_factory=lambda: f"sess_{uuid.uuid4().hex[:20]}")

    @classmethod
    def initial(cls, limits: Limits) -> Settings:
        if not limits.voices:
            return cls(audio=False, max_tokens=limits.default_tokens)
        voice = "ethan" if "ethan" in limits.voices else min(limits.voices)
        return cls(voice=voice, max_tokens=limits.default_tokens)

    def updated(self, update: SessionUpdate | ResponseOptions, limits: Limits) -> Settings:
        """These settings with ``update``'s fields over them; a 400 naming the field for one
        this deployment cannot honour (then nothing changes), under the event's own key.
        """
        where = "session" if isinstance(update, SessionUpdate) else "response"
        refused = unsupported(update)
        if refused:
            raise ApiError(400, refused[1], f"{where}.{refused[0]}")
        if isinstance(update, SessionUpdate) and update.model not in (None, limits.model):
            message = (
                f"model {update.model!r} is not served here; this server serves {limits.model!r}"
            )
            raise ApiError(400, message, f"{where}.model")
        new = replace(self)
        if update.instructions is not None:
            new.instructions = update.instructions
        if update.output_modalities is not None:
            new.audio = update.output_modalities == ["audio"]
            if new.audio and not limits.voices:
                message = "this deployment answers in text only: its pipeline has no talker stage"
                raise ApiError(400, message, f"{where}.output_modalities")
        audio = update.audio
        if audio and audio.output and audio.output.voice is not None:
            if audio.output.voice.lower() not in limits.voices:
                message = f"unknown voice {audio.output.voice!r}; voices: {sorted(limits.voices)}"
                raise ApiError(400, message, f"{where}.audio.output.voice")
            new.voice = audio.output.voice.lower()
        if audio and audio.input and "turn_detection" in audio.input.model_fields_set:
            new.vad = audio.input.turn_detection
        if audio and audio.input and "transcription" in audio.input.model_fields_set:
            new.transcription = _checked_transcription(audio.input.transcription, limits)
        if update.max_output_tokens is not None:
            if update.max_output_tokens == "inf":
                new.max_tokens = limits.max_tokens
            elif not 1 <= update.max_output_tokens <= limits.max_tokens:
                message = f"max_output_tokens must be 1 to {limits.max_tokens} (or 'inf')"
                raise ApiError(400, message, f"{where}.max_output_tokens")
            else:
                new.max_tokens = update.max_output_tokens
        if update.temperature is not None:
            new.temperature = update.temperature
        if update.seed is not None:
            new.seed = update.seed
        if isinstance(update, SessionUpdate) and update.truncation is not None:
            new.truncation = update.truncation
        return new

    def ask(self, messages: list[dict[str, Any]]) -> Ask:
        """An answer to ``messages`` under these settings. Where a conversation over the
        context would be cut, its prompt must leave room for the whole answer."""
        room = self.max_tokens if self.kept_share() is not None else 1
        return Ask(
            messages,
            self.audio,
            self.voice,
            self.max_tokens,
            self.temperature,
            self.seed,
            session_id=self.id,
            reply_room=room,
        )

    def kept_share(self) -> float | None:
        """The share of the context a cut leaves used (``None``: never cut, fail instead)."""
        if self.truncation == "disabled":
            return None
        return 1.0 if self.truncation == "auto" else self.truncation.retention_ratio

    def as_json(self, limits: Limits) -> dict[str, Any]:
        """OpenAI's session object, as ``session.created`` and ``session.updated`` carry it."""
        vad = self.vad.model_dump(exclude={"eagerness"}) if self.vad else None
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": limits.model,
            "output_modalities": ["audio" if self.audio else "text"],
            "instructions": self.instructions or "",
            "audio": {
                "input": {
                    "format": PCM,
                    "transcription": _shown(self.transcription, limits),
                    "noise_reduction": None,
                    "turn_detection": vad,
                },
                "output": {"format": PCM, "voice": self.voice, "speed": 1.0},
            },
            "max_output_tokens": self.max_tokens,
            "tools": [],
            "tool_choice": "auto",
            "temperature": self.temperature,
            "seed": self.seed,
            "truncation": (
                self.truncation
                if isinstance(self.truncation, str)
                else self.truncation.model_dump(exclude_none=True)
            ),
        }


def _checked_transcription(
    asked: InputTranscription | None, limits: Limits
) -> InputTranscription | None:
    """The transcription settings to keep (the served model named); a 400 naming the field
    for one this deployment cannot do."""
    if asked is None:
        return None
    where = "session.audio.input.transcription"
    if not limits.languages:
        raise ApiError(400, "this deployment does not transcribe audio", where)
    if asked.model not in (None, limits.model):
        message = (
            f"model {asked.model!r} is not served here; the served model {limits.model!r} "
            "transcribes (name it, or leave model out)"
        )
        raise ApiError(400, message, f"{where}.model")
    if asked.language is not None and asked.language not in limits.languages:
        message = (
            f"language {asked.language!r} is not one this model hears; "
            f"it hears {sorted(limits.languages)}"
        )
        raise ApiError(400, message, f"{where}.language")
    return asked.model_copy(update={"model": limits.model})


def _shown(transcription: InputTranscription | None, limits: Limits) -> dict[str, Any] | None:
    if transcription is None:
        return None
    return {
        "model": limits.model,
        "language": transcription.language,
        "prompt": transcription.prompt or "",
    }
