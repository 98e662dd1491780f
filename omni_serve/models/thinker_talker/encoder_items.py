"""The encoder stage's work for one request: every media item's rows, from the item cache
where the conversation sent the item before, from the family's towers otherwise.

Rows per item: audio, the audio tower's rows of one clip; images and videos, the vision
tower's rows (with Qwen3-Omni's deepstack features concatenated on the last dim) of one image
or video. Items are keyed by their content (a clip's samples, an image's pixels, a video's
frames), so the same clip or image in the next turn of a chat is found whatever else comes
with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from PIL import Image

from omni_serve.engines.encoders.base import EncoderOutput
from omni_serve.engines.encoders.item_cache import EncodedItemCache, encode_with_cache
from omni_serve.models.thinker_talker.session_rows import digest


class MediaTowers(Protocol):
    """A family's audio and vision towers (``models/<family>/encoders.py``)."""

    merge: int  # the vision tower's spatial merge: a grid's rows are t * h * w / merge**2

    def clip_features(self, clip: np.ndarray | torch.Tensor) -> torch.Tensor: ...

    def clip_rows(self, feature_lens: torch.Tensor) -> torch.Tensor: ...

    def encode_audio(self, features: torch.Tensor, feature_lens: torch.Tensor) -> EncoderOutput: ...

    def encode_clips(self, clips: Sequence[np.ndarray | torch.Tensor]) -> EncoderOutput: ...

    def encode_images(self, images: Sequence[Image.Image]) -> EncoderOutput: ...

    def encode_videos(self, videos: Sequence[np.ndarray | torch.Tensor]) -> EncoderOutput: ...


def _split_vision(out: EncoderOutput, grid_thw: torch.Tensor, merge: int) -> list[torch.Tensor]:
    rows = torch.cat([out.embeds, *out.deepstack], dim=-1).cpu()
    return list(rows.split((grid_thw.prod(-1) // merge**2).tolist()))


class CachedEncoders:
    """Runs on the encoder's worker threads (under ``no_grad``); rows come back on the host."""

    def __init__(self, encoders: MediaTowers, cache: EncodedItemCache) -> None:
        self.encoders = encoders
        self.cache = cache
        self.merge = encoders.merge

    def audio(self, samples: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
        """``samples``: the clips' samples one after another (16 kHz float32)."""
        clips = list(samples.split(list(lengths)))
        keys = [f"audio:{digest(clip)}" for clip in clips]

        def encode(which: list[int]) -> list[torch.Tensor]:
            out = self.encoders.encode_clips([clips[i].numpy() for i in which])
            sizes = self.encoders.clip_rows(out.meta["feature_lens"])
            return list(out.embeds.cpu().split(sizes.tolist()))

        return encode_with_cache(self.cache, keys, encode)

    def images(self, images: Sequence[Image.Image]) -> list[torch.Tensor]:
        """``images``: RGB (patched in ``encode_images``)."""
        keys = [f"image:{digest(np.asarray(image))}" for image in images]

        def encode(which: list[int]) -> list[torch.Tensor]:
            out = self.encoders.encode_images([images[i] for i in which])
            return _split_vision(out, out.meta["grid_thw"], self.merge)

        return encode_with_cache(self.cache, keys, encode)

    def videos(self, videos: Sequence[np.ndarray | torch.Tensor]) -> list[torch.Tensor]:
        """``videos``: uint8 frames [T, H, W, 3] each (patched in ``encode_videos``)."""
        keys = [f"video:{digest(torch.as_tensor(v))}" for v in videos]

        def encode(which: list[int]) -> list[torch.Tensor]:
            out = self.encoders.encode_videos([videos[i] for i in which])
            return _split_vision(out, out.meta["grid_thw"], self.merge)

        return encode_with_cache(self.cache, keys, encode)
