"""The tiny Qwen2.5-Omni checkpoint is the real architecture, loads as a real checkpoint does
(weights, processor, voices), and speaks: text and audible, varied audio from ``generate``."""

from __future__ import annotations

import torch
from transformers import AutoProcessor, Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from omni_serve.models.common.loudness import TARGET_AUDIO_RMS
from omni_serve.models.qwen2_5_omni.factory import VOICES
from omni_serve.models.qwen2_5_omni.tokens import token_id


def test_checkpoint_loads_with_real_classes(tiny_qwen2_5_omni_path):
    config = Qwen2_5OmniConfig.from_pretrained(tiny_qwen2_5_omni_path)
    assert config.architectures == ["Qwen2_5OmniForConditionalGeneration"]
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 2e6
    assert sorted(model.speaker_map) == sorted(VOICES)
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    assert type(processor).__name__ == "Qwen2_5OmniProcessor"
    assert processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>") == token_id("<|AUDIO|>")
    assert config.thinker_config.audio_token_index == token_id("<|AUDIO|>")
    assert config.talker_config.tts_text_start_token_id == token_id("<|tts_text_bos|>")


def test_generate_gives_text_and_audible_varied_audio(tiny_qwen2_5_omni_path):
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).eval()
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=text, return_tensors="pt")
    talker = model.config.talker_config
    torch.manual_seed(0)  # Token2Wav's ODE starts from noise
    ids, wav = model.generate(
        **inputs,
        speaker="Ethan",
        thinker_max_new_tokens=6,
        talker_max_new_tokens=60,
        talker_do_sample=False,
        talker_eos_token_id=[talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id],
    )
    assert ids.shape[1] > inputs["input_ids"].shape[1] + 1  # a reply of more than one token
    rms = wav.pow(2).mean().sqrt().item()
    assert len(wav) >= 24000 // 4 and wav.abs().max() < 1.0
    assert 0.3 * TARGET_AUDIO_RMS < rms < 3 * TARGET_AUDIO_RMS  # audible, not clipped
    assert wav.std() > 0.01
