"""The tiny Qwen-Image checkpoint loads in diffusers' real pipeline; images have structure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_serve.models.qwen_image.factory import PRESETS, preset_config


def test_pipeline_generates_structured_image(tiny_image_path):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(tiny_image_path)
    assert type(pipe.transformer).__name__ == "QwenImageTransformer2DModel"
    image = pipe(
        prompt="a red cube",
        num_inference_steps=2,
        height=64,
        width=64,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).images[0]
    assert image.shape == (64, 64, 3)
    assert image.std() > 0.05  # not flat
    neighbour_diff = np.abs(np.diff(image, axis=0)).mean()
    shuffled = np.random.default_rng(0).permutation(image.reshape(-1, 3)).reshape(image.shape)
    assert neighbour_diff < np.abs(np.diff(shuffled, axis=0)).mean()  # spatial structure


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_has_consistent_rope_sections(preset):
    """A preset whose rope sections do not cover its head dim builds fine and fails on first
    use (small-qwen-image's text encoder once did): check them without building."""
    config = preset_config(preset)
    text = config["text_encoder"]["text_config"]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert 2 * sum(text["rope_parameters"]["mrope_section"]) == head_dim
    dit = config["transformer"]
    assert sum(dit["axes_dims_rope"]) == dit["attention_head_dim"]
