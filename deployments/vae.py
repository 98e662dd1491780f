"""VAE stage (Qwen-Image): packed latents to an RGB image (tiled decode for large sizes)."""

from __future__ import annotations

from typing import Any

import torch
from ray import serve

from deployments.common import (
    StageWorker,
    edge_channel,
    pin_to_cores,
    stage_device,
    stage_dtype,
    stage_setup,
)
from omni_serve.models.qwen_image.stages import LatentDecoder
from omni_serve.transport import TensorRef, take


@serve.deployment
class VAEDeployment:
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "vae") -> None:
        config, stage, model_path = stage_setup(pipeline, stage_name)
        pin_to_cores(stage.deployment.cpu_cores)
        self.decoder = LatentDecoder(
            model_path,
            stage_dtype(stage),
            stage_device(stage.deployment.ray_actor_options.num_gpus),
        )
        self.channel = edge_channel(config, stage_name)
        self.worker = StageWorker("vae")
        self.images = 0

    async def decode(self, latents: TensorRef, height: int, width: int) -> TensorRef:
        packed = await take(latents)
        image = await self.worker.run(self.decoder.decode, packed, height, width)
        self.images += 1
        return self.channel.put(torch.from_numpy(image))

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"steps": self.images, "max_batch": 1, "running": 0}
