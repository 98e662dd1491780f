"""Qwen3-Omni's audio tower and vision tower as standalone encoders.

Inputs are what ``Qwen3OmniMoeProcessor`` produces (Whisper log-mel features; Qwen2-VL
patches with their grid), so a client-side or ingress-side processor feeds them directly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omni_serve.engines.encoders.base import EncoderOutput
from omni_serve.models.qwen3_omni.checkpoint import load_config, load_submodule


class Qwen3OmniEncoders:
    """``device``: where the towers run. Inputs may come on the CPU; outputs stay on the
    device (the caller decides where they go next)."""

    def __init__(
        self, checkpoint: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> None:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeAudioEncoder,
            Qwen3OmniMoeVisionEncoder,
        )

        config = load_config(checkpoint).thinker_config
        self.audio = Qwen3OmniMoeAudioEncoder._from_config(config.audio_config)
        load_submodule(self.audio, checkpoint, "thinker.audio_tower.")
        self.visual = Qwen3OmniMoeVisionEncoder._from_config(config.vision_config)
        load_submodule(self.visual, checkpoint, "thinker.visual.")
        self.audio.to(device=device, dtype=dtype)
        self.visual.to(device=device, dtype=dtype)
        self.device = torch.device(device)

    def encode_audio(
        self, input_features: torch.Tensor, feature_lens: torch.Tensor
    ) -> EncoderOutput:
        """``input_features`` [128, sum(F)] (mel bins x frames of all clips, unpadded)."""
        out = self.audio(
            input_features.to(self.device, self.audio.dtype),
            feature_lens=feature_lens.to(self.device),
            return_dict=True,
        )
        return EncoderOutput(
            embeds=out.last_hidden_state, meta={"feature_lens": feature_lens.clone()}
        )

    def encode_image(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> EncoderOutput:
        out = self.visual(
            pixel_values.to(self.device, self.visual.dtype), grid_thw=grid_thw.to(self.device)
        )
        return EncoderOutput(
            embeds=out.pooler_output,
            deepstack=list(out.deepstack_features),
            meta={"grid_thw": grid_thw.clone()},
        )
