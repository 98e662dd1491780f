"""The tiny Qwen3-Omni checkpoint is the real architecture and gives non-degenerate output."""

from __future__ import annotations

import torch
from transformers import AutoProcessor, Qwen3OmniMoeConfig

from omni_serve.models.common.loudness import TARGET_AUDIO_RMS


def test_checkpoint_loads_with_real_classes(tiny_omni_path, hf_omni):
    config = Qwen3OmniMoeConfig.from_pretrained(tiny_omni_path)
    assert config.architectures == ["Qwen3OmniMoeForConditionalGeneration"]
    params = sum(p.numel() for p in hf_omni.parameters())
    assert 3e6 < params < 10e6
    processor = AutoProcessor.from_pretrained(tiny_omni_path)
    assert type(processor).__name__ == "Qwen3OmniMoeProcessor"


def test_generate_gives_text_and_audible_varied_audio(reference_runs):
    run = reference_runs["text"]
    assert len(run.generated) > 1
    wav = run.waveform
    assert wav.shape[0] == run.codes.shape[1] * 1920 - 555
    rms = wav.pow(2).mean().sqrt().item()
    assert 0.3 * TARGET_AUDIO_RMS < rms < 3 * TARGET_AUDIO_RMS  # audible, not clipped
    assert wav.abs().max() < 1.0
    assert wav.std() > 0.01 and len(torch.unique(run.codes[0])) > 3  # not constant
