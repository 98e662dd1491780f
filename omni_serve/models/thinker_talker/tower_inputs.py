"""What both omni families' standalone towers share: their Thinker's processor, and the
towers' inputs made as it makes them from the media themselves (clips' features by the
family's ``clip_features``, images' and videos' patches), then encoded by the family's
``encode_audio`` and ``encode_image``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from omni_serve.engines.encoders.base import EncoderOutput
from omni_serve.models.thinker_talker.thinker_inputs import video_frame_size


class ProcessorInputs(ABC):
    def _load_towers(
        self,
        checkpoint: str | Path,
        thinker_config: Any,
        towers: tuple[type, type],
        load_submodule: Callable[[torch.nn.Module, str | Path, str], Any],
        dtype: torch.dtype,
        device: str,
    ) -> None:
        """The Thinker's (audio, vision) ``towers`` classes built from ``thinker_config`` and
        loaded from the checkpoint's ``thinker.audio_tower.`` and ``thinker.visual.``
        weights (with the family's ``load_submodule``) onto ``device``; then its processor."""
        audio, vision = towers
        self.audio = audio._from_config(thinker_config.audio_config)
        load_submodule(self.audio, checkpoint, "thinker.audio_tower.")
        self.visual = vision._from_config(thinker_config.vision_config)
        load_submodule(self.visual, checkpoint, "thinker.visual.")
        self.audio.to(device=device, dtype=dtype)
        self.visual.to(device=device, dtype=dtype)
        self.device = torch.device(device)
        self.merge = self.visual.spatial_merge_size
        self._load_processor(checkpoint)

    def _load_processor(self, checkpoint: str | Path) -> None:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(checkpoint)
        self.feature_extractor = processor.feature_extractor
        self.image_processor = processor.image_processor
        self.video_processor = processor.video_processor
        self.video_size = video_frame_size(processor)  # the bounds the whole processor uses

    @abstractmethod
    def clip_features(self, clip: np.ndarray | torch.Tensor) -> torch.Tensor:
        """One clip's log-mel features [mel, frames], as the family's processor makes them."""

    @abstractmethod
    def encode_audio(self, features: torch.Tensor, feature_lens: torch.Tensor) -> EncoderOutput:
        """The audio tower's rows of clips' features side by side [mel, sum(frames)]."""

    @abstractmethod
    def encode_image(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> EncoderOutput:
        """The vision tower's rows of patches with their grids (images or videos)."""

    def encode_clips(self, clips: Sequence[np.ndarray | torch.Tensor]) -> EncoderOutput:
        """Clips as the Thinker's processor would get them (16 kHz float32 mono); rows of all,
        in order, each clip's features made as if it came alone."""
        features = [self.clip_features(clip) for clip in clips]
        lens = torch.tensor([f.shape[1] for f in features])
        return self.encode_audio(torch.cat(features, dim=1), lens)

    def encode_images(self, images: Sequence[Image.Image]) -> EncoderOutput:
        """RGB images, as the Thinker's processor would get them; rows of all, in order."""
        patches = self.image_processor(images=list(images), return_tensors="pt")
        return self.encode_image(patches["pixel_values"], patches["image_grid_thw"])

    def encode_videos(self, videos: Sequence[np.ndarray | torch.Tensor]) -> EncoderOutput:
        """``videos``: uint8 frames [T, H, W, 3] each, already sampled (the API's rate), as the
        Thinker's processor would get them; rows of all videos, in order."""
        frames = [v.numpy() if isinstance(v, torch.Tensor) else v for v in videos]
        patches = self.video_processor(videos=frames, size=self.video_size, return_tensors="pt")
        return self.encode_image(patches["pixel_values_videos"], patches["video_grid_thw"])
