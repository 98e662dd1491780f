"""VAE stage (Qwen-Image): packed latents to an RGB image (tiled decode for large sizes)."""

from __future__ import annotations

from typing import Any

import torch
from ray import serve

from deployments.common import (
    ReleasesSharedMemory,
    StageWorker,
    edge_channel,
    export_stage_metrics,
    torch_stage,
)
from omni_serve.models.qwen_image.stages import LatentDecoder
from omni_serve.transport import TensorRef, channel_stats, take


@serve.deployment
class VAEDeployment(ReleasesSharedMemory):
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "vae") -> None:
        setup = torch_stage(pipeline, stage_name)
        self.decoder = LatentDecoder(setup.model_path, setup.dtype, setup.device)
        self.channel = edge_channel(setup.config, stage_name)
        self.worker = StageWorker("vae")
        self.images = 0
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def decode(self, latents: TensorRef, height: int, width: int) -> TensorRef:
        packed = await take(latents)
        image = await self.worker.run(self.decoder.decode, packed, height, width)
        self.images += 1
        return self.channel.put(torch.from_numpy(image))

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "steps": self.images,
            "max_batch": 1,
            "running": 0,
            "run_s": self.worker.busy_s,
            "channel": channel_stats(),
        }
