"""What Qwen3-Omni is asked when a clip is to be transcribed or translated.

The model has no transcription head: it is told, after the clip, what to do with it. The
wording is the one vLLM 0.32 sends this model for its own ``/v1/audio/transcriptions``
(``Qwen3OmniMoeThinkerForConditionalGeneration.get_generation_prompt``), so a client moving
from vLLM gets the same prompt, and so the same text.
"""

from __future__ import annotations

from typing import Any, Literal

# Qwen3-Omni's speech input languages, by ISO 639-1 code (Cantonese by ISO 639-3), as its
# model card lists them.
SPEECH_LANGUAGES = {
    "en": "English",
    "zh": "Chinese",
    "ko": "Korean",
    "ja": "Japanese",
    "de": "German",
    "ru": "Russian",
    "it": "Italian",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "ms": "Malay",
    "nl": "Dutch",
    "id": "Indonesian",
    "tr": "Turkish",
    "vi": "Vietnamese",
    "yue": "Cantonese",
    "ar": "Arabic",
    "ur": "Urdu",
}

Task = Literal["transcribe", "translate"]


def unknown_language(language: str) -> str | None:
    """Why ``language`` cannot be asked for, or None when it can."""
    if language in SPEECH_LANGUAGES:
        return None
    return f"language {language!r} is not one this model hears; it hears {sorted(SPEECH_LANGUAGES)}"


def instruction(task: Task, language: str | None = None, prompt: str | None = None) -> str:
    """The text that follows the clip. Transcribing names the clip's language when the client
    gave it; translating goes into English, as OpenAI's ``/v1/audio/translations`` does. A
    client's ``prompt`` (context, spellings) comes last."""
    text = "Transcribe this audio" if task == "transcribe" else "Translate this audio"
    if task == "transcribe" and language:
        text += f" into {SPEECH_LANGUAGES[language]}"
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
