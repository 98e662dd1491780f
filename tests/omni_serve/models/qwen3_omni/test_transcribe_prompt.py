"""What Qwen3-Omni is told after a clip to transcribe or translate it (the wording vLLM uses:
tests/integration/test_transcription_prompt.py checks the prompts are the same)."""

from __future__ import annotations

from omni_serve.models.qwen3_omni.transcribe_prompt import instruction, unknown_language


def test_the_instruction_names_the_language_and_the_clients_prompt_comes_last():
    assert instruction("transcribe") == "Transcribe this audio."
    assert instruction("transcribe", "fr", "Names: Ana.") == (
        "Transcribe this audio into French. Names: Ana."
    )
    assert instruction("translate") == "Translate this audio into English."
    assert instruction("translate", None, "Formal.") == "Translate this audio into English. Formal."


def test_languages_the_model_does_not_hear_are_named_with_those_it_does():
    assert unknown_language("yue") is None and unknown_language("en") is None
    why = unknown_language("xx")
    assert why is not None and why.startswith("language 'xx' is not one this model hears")
    assert "'fr'" in why
