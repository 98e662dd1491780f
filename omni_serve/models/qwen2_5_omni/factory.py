"""Random-weight Qwen2.5-Omni checkpoints of the real architecture, built offline.

The preset JSONs are ``Qwen2_5OmniConfig`` kwargs (tiny: ~0.8 M params, for tests; small:
~38 M, for benchmarks). A checkpoint directory holds what a real one holds: the weights, the
processor, and ``spk_dict.pt``, each voice's speaker conditioning for Token2Wav (``cond``: the
speaker embedding, ``ref_mel``: a reference mel spectrogram) and the text token the Talker
starts its reply with (``bos_token``). Here those are seeded random tensors, one set per voice
of the real checkpoint.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

PRESETS = {"tiny-qwen2-5-omni": "tiny.json", "small-qwen2-5-omni": "small.json"}
VOICES = ("Chelsie", "Ethan")
SEED = 0
FACTORY_VERSION = 1  # bump when the bytes a preset builds change
REFERENCE_MEL_FRAMES = 60


def preset_config(preset: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("presets", PRESETS[preset]).read_text()
    return json.loads(text)


def spec(preset: str) -> dict[str, Any]:
    """Everything that determines the checkpoint's bytes (hashed into its cache path)."""
    return {
        "family": "qwen2_5_omni",
        "preset": preset,
        "config": preset_config(preset),
        "voices": list(VOICES),
        "seed": SEED,
        "factory_version": FACTORY_VERSION,
    }


def build(preset: str, directory: Path) -> None:
    import torch
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    from omni_serve.models.common.random_init import fan_in_init
    from omni_serve.models.qwen2_5_omni.processor import save_processor

    config = Qwen2_5OmniConfig(**preset_config(preset))
    torch.manual_seed(SEED)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    fan_in_init(model, SEED)
    speakers = _speakers(config)
    _calibrate_loudness(model.token2wav, speakers[VOICES[0]])
    model.generation_config.do_sample = False
    model.save_pretrained(directory, safe_serialization=True)
    torch.save(speakers, directory / "spk_dict.pt")
    vision = config.thinker_config.vision_config
    save_processor(directory, vision_patch_size=vision.patch_size)


def _speakers(config: Any) -> dict[str, dict[str, Any]]:
    """Each voice's conditioning: seeded, so the checkpoint's bytes are the preset's."""
    import torch

    from omni_serve.models.qwen2_5_omni.tokens import token_id

    dit = config.token2wav_config.dit_config
    gen = torch.Generator().manual_seed(SEED + 1)
    return {
        voice: {
            "cond": torch.randn(1, dit.enc_emb_dim, generator=gen),
            "ref_mel": torch.randn(1, REFERENCE_MEL_FRAMES, dit.mel_dim, generator=gen),
            "bos_token": token_id(f"<|tts_bos_{voice.lower()}|>"),
        }
        for voice in VOICES
    }


def _calibrate_loudness(token2wav: Any, speaker: dict[str, Any]) -> None:
    """BigVGAN's output at speech-like loudness for fixed random codes and seeded noise."""
    import torch

    from omni_serve.models.common.loudness import scale_to_loudness

    gen = torch.Generator().manual_seed(SEED)
    codes = torch.randint(0, 256, (1, 24), generator=gen)

    def decode() -> None:
        torch.manual_seed(SEED)  # the DiT starts from noise
        token2wav(codes, conditioning=speaker["cond"], reference_mel=speaker["ref_mel"])

    scale_to_loudness(token2wav.code2wav_bigvgan_model.conv_post, decode)
