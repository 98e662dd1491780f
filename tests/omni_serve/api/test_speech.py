"""The speech request: OpenAI's voice steering is refused, not ignored."""

from __future__ import annotations

from omni_serve.api.speech import SpeechRequest


def test_speech_instructions_are_refused_not_ignored():
    steered = SpeechRequest(model="m", input="Hi", instructions="Whisper.")
    assert steered.unsupported() == (
        "instructions",
        "this model's voice cannot be steered by instructions",
    )
    assert SpeechRequest(model="m", input="Hi", instructions="").unsupported() is None
