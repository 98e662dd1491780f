"""``POST /v1/audio/speech``: OpenAI's text-to-speech request, with omni-serve's extensions
(per-stage settings, a deadline, a session, a seed)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from omni_serve.api.protocol import OmniExtensions


class SpeechRequest(OmniExtensions):
    """OpenAI ``/v1/audio/speech``."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="Served model id.")
    input: str = Field(min_length=1, max_length=4096, description="The text to speak.")
    voice: str = Field("ethan", description="Speaker voice.")
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus"] = Field(
        "wav", description="Audio encoding (pcm = raw 16-bit little-endian, 24 kHz mono)."
    )
    speed: float = Field(
        1.0, ge=0.25, le=4.0, description="Playback speed (resampled: pitch changes with it)."
    )
    stream_format: Literal["audio", "sse"] | None = Field(
        None, description="Stream raw audio chunks (wav/pcm) or SSE events; None = one response."
    )
    seed: int | None = Field(
        None,
        description="omni-serve extension: the same seed (and text and voice) gives the same "
        "audio; the Talker's seed is derived from it unless stage_overrides sets one.",
    )
    instructions: str | None = Field(
        None,
        description="OpenAI's steering of the voice's tone and style: not offered by this "
        "model, so any is a 400.",
    )

    def unsupported(self) -> tuple[str, str] | None:
        """(param, reason) of an OpenAI setting this server does not honour but was asked
        for: a 400, not speech that silently ignores it."""
        if self.instructions:
            return "instructions", "this model's voice cannot be steered by instructions"
        return None
