"""What a Thinker-Talker model is asked when a clip is to be transcribed or translated.

These models have no transcription head: the Thinker is told, after the clip, what to do with
it. The wording is the one vLLM 0.32 sends Qwen3-Omni for its own ``/v1/audio/transcriptions``
(``Qwen3OmniMoeThinkerForConditionalGeneration.get_generation_prompt``), so a client moving
from vLLM gets the same prompt, and so the same text. vLLM has no transcription for
Qwen2.5-Omni; it is asked in the same words. Which languages a transcription may name is the
family's (``ThinkerTalkerFamily.transcription``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Task = Literal["transcribe", "translate"]


@dataclass(frozen=True)
class TranscriptionPrompt:
    """``languages``: the speech languages the model hears, ISO code to English name (the
    name goes into the instruction)."""

    languages: Mapping[str, str]

    def unknown_language(self, language: str) -> str | None:
        """Why ``language`` cannot be asked for, or None when it can."""
        if language in self.languages:
            return None
        heard = sorted(self.languages)
        return f"language {language!r} is not one this model hears; it hears {heard}"

    def instruction(
        self, task: Task, language: str | None = None, prompt: str | None = None
    ) -> str:
        """The text that follows the clip. Transcribing names the clip's language when the
        client gave it; translating goes into English, as OpenAI's
        ``/v1/audio/translations`` does. A client's ``prompt`` (context, spellings) comes
        last."""
        text = "Transcribe this audio" if task == "transcribe" else "Translate this audio"
        if task == "transcribe" and language:
            text += f" into {self.languages[language]}"
        elif task == "translate":
            text += " into English"
        text += "."
        return f"{text} {prompt}" if prompt else text


def transcription_messages(clip_b64: str, fmt: str, asked: str) -> list[dict[str, Any]]:
    """The chat the Thinker answers for a transcription: the clip (base64, in ``fmt``), then
    what to do with it (``instruction``'s text), as one user message."""
    content = [
        {"type": "input_audio", "input_audio": {"data": clip_b64, "format": fmt}},
        {"type": "text", "text": asked},
    ]
    return [{"role": "user", "content": content}]
