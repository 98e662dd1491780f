"""Random-weight Qwen-Image pipelines (diffusers ``QwenImagePipeline`` layout), built offline.

tiny: 2-layer DiT, ~41 MB, for tests. small: 24-layer DiT (the depth at which cache-dit's
step caching was measured in CPU_STACK.md) for benchmarks. The saved directory loads with
``QwenImagePipeline.from_pretrained`` exactly as a real checkpoint does.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

PRESETS = {"tiny-qwen-image": "tiny.json", "small-qwen-image": "small.json"}
SEED = 0
FACTORY_VERSION = 1


def preset_config(preset: str) -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("presets", PRESETS[preset]).read_text())


def spec(preset: str) -> dict[str, Any]:
    return {
        "family": "qwen_image",
        "preset": preset,
        "config": preset_config(preset),
        "seed": SEED,
        "factory_version": FACTORY_VERSION,
    }


def build(preset: str, directory: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omni_serve.models.common.qwen_tokenizer import build_tokenizer
    from omni_serve.models.common.random_init import fan_in_init

    cfg = preset_config(preset)
    torch.manual_seed(SEED)
    transformer = QwenImageTransformer2DModel(**cfg["transformer"]).eval()
    vae = AutoencoderKLQwenImage(**cfg["vae"]).eval()
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**cfg["text_encoder"]))
    for offset, module in enumerate((transformer, vae, text_encoder)):
        fan_in_init(module, SEED + offset)
    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**cfg["scheduler"]),
        vae=vae,
        text_encoder=text_encoder.eval(),
        tokenizer=build_tokenizer(),
        transformer=transformer,
    )
    pipe.save_pretrained(directory, safe_serialization=True)
