"""What a Thinker-Talker model is told after a clip to transcribe or translate it (the wording
vLLM uses for Qwen3-Omni: tests/integration/test_transcription_prompt.py checks the prompts are
the same), in the languages its family hears."""

from __future__ import annotations

import pytest

from omni_serve.models.qwen2_5_omni.family import FAMILY as QWEN2_5_OMNI
from omni_serve.models.qwen3_omni.family import FAMILY as QWEN3_OMNI


@pytest.mark.parametrize("family", [QWEN3_OMNI, QWEN2_5_OMNI], ids=lambda f: f.name)
def test_the_instruction_names_the_language_and_the_clients_prompt_comes_last(family):
    asked = family.transcription.instruction
    assert asked("transcribe") == "Transcribe this audio."
    assert asked("transcribe", "fr", "Names: Ana.") == (
        "Transcribe this audio into French. Names: Ana."
    )
    assert asked("translate") == "Translate this audio into English."
    assert asked("translate", None, "Formal.") == "Translate this audio into English. Formal."


def test_each_family_refuses_the_languages_it_does_not_hear_naming_those_it_does():
    for family in (QWEN3_OMNI, QWEN2_5_OMNI):
        assert family.transcription.unknown_language("yue") is None
        assert family.transcription.unknown_language("en") is None
        why = family.transcription.unknown_language("xx")
        assert why is not None and why.startswith("language 'xx' is not one this model hears")
        assert "'fr'" in why
    assert QWEN3_OMNI.transcription.unknown_language("ja") is None
    why = QWEN2_5_OMNI.transcription.unknown_language("ja")
    assert why is not None and why.endswith("['en', 'fr', 'yue', 'zh']")
