"""User story: a client moving from vLLM's /v1/audio/transcriptions (and translations) to
omni-serve gets the prompt vLLM sends Qwen3-Omni for the same form, token for token, so the
same text."""

from __future__ import annotations

import numpy as np
import pytest

from omni_serve.config import ApiSettings
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.models.qwen3_omni.family import FAMILY
from omni_serve.models.thinker_talker.request import prepare_prompt
from omni_serve.testing.media import wav_b64

pytestmark = pytest.mark.integration


def vllm_prompt(model_path, task: str, language: str | None, prompt: str | None) -> str:
    from vllm.config import ModelConfig
    from vllm.config.speech_to_text import SpeechToTextParams
    from vllm.model_executor.models.qwen3_omni_moe_thinker import (
        Qwen3OmniMoeThinkerForConditionalGeneration as Thinker,
    )

    config = ModelConfig(model=str(model_path), tokenizer=str(model_path))
    params = SpeechToTextParams(
        audio=np.zeros(16000, np.float32),
        model_config=config,
        stt_config=Thinker.get_speech_to_text_config(config, task),
        language=language,
        task_type=task,
        request_prompt=prompt or "",
        to_language=None,
    )
    return Thinker.get_generation_prompt(params)["prompt"]


@pytest.mark.parametrize(
    ("task", "language", "prompt"),
    [("transcribe", None, None), ("transcribe", "fr", "Names: Ana."), ("translate", None, None)],
)
def test_the_transcription_prompt_is_vllms(tiny_omni_path, omni_processor, task, language, prompt):
    clip = np.zeros(16000, np.float32)
    content = [
        {"type": "input_audio", "input_audio": {"data": wav_b64(clip, 16000)}},
        {"type": "text", "text": FAMILY.transcription.instruction(task, language, prompt)},
    ]
    ours = prepare_prompt(
        omni_processor, [ChatMessage(role="user", content=content)], ApiSettings(), family=FAMILY
    ).prompt_ids
    theirs = omni_processor.tokenizer.encode(vllm_prompt(tiny_omni_path, task, language, prompt))
    assert ours == theirs
