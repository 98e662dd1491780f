"""Qwen3-Omni's audio tower and vision tower as standalone encoders.

The towers take what ``Qwen3OmniMoeProcessor`` produces (Whisper log-mel features; Qwen2-VL
patches with their grid). The encoder stage is sent the media themselves (clips' samples,
images' pixels, videos' frames) and makes those here, on the encoder's replicas rather than on
the ingress that every request's prompt goes through: a 30 s clip's features take ~12 ms of
CPU, a 1080p image's patches ~50 ms, 60 frames of 720p 2.5 s (and their float32 patches are
~3x the frames' bytes: 530 MB against 166 MB).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

# Private in transformers 5.19, and what the tower itself uses to size a clip's output.
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    _get_feat_extract_output_lengths,
)

from omni_serve.engines.encoders.base import EncoderOutput
from omni_serve.models.qwen3_omni.checkpoint import load_config, load_submodule
from omni_serve.models.thinker_talker.thinker_inputs import clip_features
from omni_serve.models.thinker_talker.tower_inputs import ProcessorInputs


class Qwen3OmniEncoders(ProcessorInputs):
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
        towers = (Qwen3OmniMoeAudioEncoder, Qwen3OmniMoeVisionEncoder)
        self._load_towers(checkpoint, config, towers, load_submodule, dtype, device)

    def clip_features(self, clip: np.ndarray | torch.Tensor) -> torch.Tensor:
        """One clip's log-mel features [mel, frames], as if it came alone."""
        return clip_features(self.feature_extractor, np.asarray(clip))

    def clip_rows(self, feature_lens: torch.Tensor) -> torch.Tensor:
        """How many rows the audio tower makes of clips of ``feature_lens`` mel frames."""
        return _get_feat_extract_output_lengths(feature_lens, self.audio.n_window)

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
