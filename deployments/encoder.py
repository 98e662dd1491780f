"""Encoder stage: the family's audio and vision towers on their own replicas.

Audio rows: the Thinker takes the prompt as embeddings with them in the audio positions.
Image and video rows (Qwen3-Omni's deepstack features concatenated on the last dim): the
Thinker passes them to vLLM as ``image_embeds`` / ``video_embeds`` with their grids (see
``omni_serve.compat.vllm.vision_embeds``). Images and videos arrive as pixels and are
patched here.
Each item's rows are kept in a per-replica cache (``cache_mib`` engine arg, 256 by default),
so the media a conversation resends every turn are encoded once.
Rows leave on the CPU even from a GPU replica: vLLM takes prompt embeddings there (its engine
process reads them from the request), and the inline and object-store backends would otherwise
carry CUDA tensors to a consumer that may have no GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from ray import serve

from deployments.common import ReleasesSharedMemory, edge_channel, export_stage_metrics, torch_stage
from omni_serve.engines.encoders.base import TorchEncoderEngine
from omni_serve.models.registry import thinker_talker_family
from omni_serve.models.thinker_talker.media_payload import media_from_payload
from omni_serve.transport import TensorRef, channel_stats, take
from omni_serve.transport.base import cat_into, put_in_place

DEFAULT_CACHE_MIB = 256


def _like(items: list[torch.Tensor]) -> torch.Tensor:
    """What the channel carries for ``items`` (rows [N_i, H] each): their concatenation, as
    float32 on the host."""
    rows = sum(item.shape[0] for item in items)
    return torch.empty((rows, items[0].shape[-1]), dtype=torch.float32, device="meta")


def _items(entry: Any) -> list[Any]:
    return entry if isinstance(entry, list) else [entry]


@serve.deployment
class EncoderDeployment(ReleasesSharedMemory):
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "encoder") -> None:
        setup = torch_stage(pipeline, stage_name)
        cache_mib = float(setup.stage.engine.args.get("cache_mib", DEFAULT_CACHE_MIB))
        family = thinker_talker_family(setup.config.family)
        self.items = family.load_encoders(
            setup.model_path, setup.dtype, setup.device, int(cache_mib * 2**20)
        )
        self.audio = TorchEncoderEngine(self.items.audio)
        self.vision = TorchEncoderEngine(self.items.images)
        self.video = TorchEncoderEngine(self.items.videos)
        self.channel = edge_channel(setup.config, stage_name)
        self.clips = 0
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def encode_audio(self, samples: TensorRef, lengths: list[int]) -> TensorRef:
        """Rows for every clip, in prompt order, as one channel ref ([sum N_i, H]), from the
        clips' samples one after another (16 kHz float32; ``lengths`` of them each)."""
        items = await self.audio.encode(samples=await take(samples), lengths=lengths)
        self.clips += len(lengths)
        return self._put(items)

    async def encode_images(self, pixels: TensorRef, layout: dict[str, Any]) -> TensorRef:
        """Rows of every image, in prompt order: [sum N_i, H * (1 + deepstack levels)];
        ``pixels``: a ``media_payload`` of the images (RGB)."""
        images = _items(media_from_payload(await take(pixels), layout)["image"])
        items = await self.vision.encode(images=images)
        self.clips += len(images)
        return self._put(items)

    async def encode_videos(self, frames: TensorRef, layout: dict[str, Any]) -> TensorRef:
        """Rows of every video, in prompt order, as ``encode_images`` gives them; ``frames``:
        a ``media_payload`` of the videos (uint8 [T, H, W, 3] each)."""
        videos = _items(media_from_payload(await take(frames), layout)["video"])
        items = await self.video.encode(videos=videos)
        self.clips += len(videos)
        return self._put(items)

    def _put(self, items: list[torch.Tensor]) -> TensorRef:
        return put_in_place(self.channel, _like(items), lambda rows: cat_into(rows, items))

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        cache = self.items.cache.stats()
        return {
            "steps": self.clips,
            "max_batch": 0,
            "running": 0,
            "channel": channel_stats(),
            "item_cache": cache,
        }
