"""Qwen2.5-Omni's audio tower and vision tower as standalone encoders, for the encoder stage.

They take what ``Qwen2_5OmniProcessor`` makes, made here from the media themselves, as for
Qwen3-Omni (``models/qwen3_omni/encoders.py`` says why on the encoder's replicas). Two
differences from Qwen3-Omni: the processor pads every clip to the feature extractor's 30 s
window before its STFT (so a clip's last frames see zeros there, not a reflected edge, and
the features here are made the same way), and the vision tower has no deepstack features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_serve.engines.encoders.base import EncoderOutput
from omni_serve.models.common.checkpoint_parts import load_submodule
from omni_serve.models.qwen2_5_omni.checkpoint import load_config
from omni_serve.models.thinker_talker.tower_inputs import ProcessorInputs


def padded_clip_features(feature_extractor: Any, clip: np.ndarray) -> torch.Tensor:
    """One clip's log-mel features [mel, frames] as ``Qwen2_5OmniProcessor`` makes them:
    padded to the 30 s window, then only the clip's own frames."""
    out = feature_extractor(
        [np.asarray(clip, dtype=np.float32)],
        sampling_rate=feature_extractor.sampling_rate,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="pt",
    )
    return out["input_features"][0][:, out["attention_mask"][0].bool()]


class Qwen25OmniEncoders(ProcessorInputs):
    """``device``: where the towers run. Inputs may come on the CPU; outputs stay on the
    device (the caller decides where they go next)."""

    def __init__(
        self, checkpoint: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> None:
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            Qwen2_5OmniAudioEncoder,
            Qwen2_5OmniVisionEncoder,
        )

        config = load_config(checkpoint).thinker_config
        towers = (Qwen2_5OmniAudioEncoder, Qwen2_5OmniVisionEncoder)
        self._load_towers(checkpoint, config, towers, load_submodule, dtype, device)

    def clip_features(self, clip: np.ndarray | torch.Tensor) -> torch.Tensor:
        """One clip's log-mel features [mel, frames], as the Thinker's processor makes them."""
        return padded_clip_features(self.feature_extractor, np.asarray(clip))

    def clip_rows(self, feature_lens: torch.Tensor) -> torch.Tensor:
        """How many rows the audio tower makes of clips of ``feature_lens`` mel frames."""
        return self.audio._get_feat_extract_output_lengths(feature_lens)[1]

    def encode_audio(
        self, input_features: torch.Tensor, feature_lens: torch.Tensor
    ) -> EncoderOutput:
        """``input_features`` [128, sum(F)] (mel bins x frames of all clips, unpadded)."""
        after_cnn, _ = self.audio._get_feat_extract_output_lengths(feature_lens)
        out = self.audio(
            input_features.to(self.device, self.audio.dtype),
            feature_lens=feature_lens.to(self.device),
            aftercnn_lens=after_cnn.to(self.device),
        )
        return EncoderOutput(
            embeds=out.last_hidden_state, meta={"feature_lens": feature_lens.clone()}
        )

    def encode_image(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> EncoderOutput:
        out = self.visual(
            pixel_values.to(self.device, self.visual.dtype), grid_thw=grid_thw.to(self.device)
        )
        return EncoderOutput(embeds=out.pooler_output, meta={"grid_thw": grid_thw.clone()})
