"""Text encoder stage (Qwen-Image): prompts to the DiT's conditioning rows.

Runs the Qwen2.5-VL text model with torch: the DiT needs the last layer's hidden state of every
prompt token, which vLLM does not return for a prompt.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from deployments.common import (
    StageWorker,
    edge_channel,
    pin_to_cores,
    stage_device,
    stage_dtype,
    stage_setup,
)
from omni_serve.models.qwen_image.stages import PromptEncoder
from omni_serve.transport import TensorRef


@serve.deployment
class TextEncoderDeployment:
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "text_encoder") -> None:
        config, stage, model_path = stage_setup(pipeline, stage_name)
        pin_to_cores(stage.deployment.cpu_cores)
        self.encoder = PromptEncoder(
            model_path,
            stage_dtype(stage),
            stage_device(stage.deployment.ray_actor_options.num_gpus),
        )
        self.channel = edge_channel(config, stage_name)
        self.worker = StageWorker("text-encoder")
        self.prompts = 0

    async def encode(self, prompts: list[str]) -> list[TensorRef]:
        rows = await self.worker.run(self.encoder.encode, prompts)
        self.prompts += len(prompts)
        return [self.channel.put(r.float()) for r in rows]

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"steps": self.prompts, "max_batch": 0, "running": 0}
