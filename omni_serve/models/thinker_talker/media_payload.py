"""A prompt's raw media (audio clips, images, video frames) as one tensor-channel payload, for
prompts the Thinker encodes itself (audio with images or videos: vLLM 0.32 takes no raw audio
next to vision embeddings; or a graph without an encoder stage), and for videos on their way
to the encoder stage.

Why: vLLM wants numpy clips and PIL images, and as handle arguments they are pickled on every
hop (ingress → Talker → Thinker for a spoken reply; a 1024² image is 3 MB, a 30 s clip 1.9 MB).
As tensors on the channel they are one copy on the ingress's side and views on the Thinker's;
only the small layout (sample rates, which entries were lists) rides the calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image


def _items(entry: Any) -> tuple[list, bool]:
    """vLLM's one-item-or-list convention: the items, and whether they came as a list."""
    return (list(entry), True) if isinstance(entry, list) else ([entry], False)


def media_payload(media: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``multi_modal_data`` (``audio``: ``(clip, rate)`` or a list of them; ``image``: a PIL
    image or a list; ``video``: uint8 frames [T, H, W, 3] or a list) as named tensors for the
    channel, and the layout that rebuilds it."""
    unknown = set(media) - {"audio", "image", "video"}
    if unknown:
        raise ValueError(f"no channel layout for media kinds {sorted(unknown)}")
    tensors: dict[str, torch.Tensor] = {}
    layout: dict[str, Any] = {}
    if "audio" in media:
        clips, many = _items(media["audio"])
        layout["audio"] = {"rates": [int(rate) for _, rate in clips], "many": many}
        for i, (clip, _) in enumerate(clips):
            tensors[f"audio.{i}"] = torch.from_numpy(np.ascontiguousarray(clip, np.float32))
    if "image" in media:
        images, many = _items(media["image"])
        layout["image"] = {"count": len(images), "many": many}
        for i, image in enumerate(images):
            # RGB, as the API decodes every image (omni_serve.media.decode.load_image).
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            tensors[f"image.{i}"] = torch.from_numpy(np.array(rgb))
    if "video" in media:
        videos, many = _items(media["video"])
        layout["video"] = {"count": len(videos), "many": many}
        for i, frames in enumerate(videos):
            tensors[f"video.{i}"] = torch.from_numpy(np.ascontiguousarray(frames, np.uint8))
    return tensors, layout


def media_from_payload(tensors: dict[str, torch.Tensor], layout: dict[str, Any]) -> dict[str, Any]:
    """``multi_modal_data`` again, from what the channel gave back."""
    media: dict[str, Any] = {}
    if "audio" in layout:
        rates = layout["audio"]["rates"]
        clips = [(tensors[f"audio.{i}"].numpy(), rate) for i, rate in enumerate(rates)]
        media["audio"] = clips if layout["audio"]["many"] else clips[0]
    if "image" in layout:
        count = layout["image"]["count"]
        images = [Image.fromarray(tensors[f"image.{i}"].numpy()) for i in range(count)]
        media["image"] = images if layout["image"]["many"] else images[0]
    if "video" in layout:
        videos = [tensors[f"video.{i}"].numpy() for i in range(layout["video"]["count"])]
        media["video"] = videos if layout["video"]["many"] else videos[0]
    return media
