"""Text encoder stage (Qwen-Image): prompts to the DiT's conditioning rows.

Runs the Qwen2.5-VL text model with torch: the DiT needs the last layer's hidden state of every
prompt token, which vLLM does not return for a prompt.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from deployments.common import (
    ReleasesSharedMemory,
    StageWorker,
    edge_channel,
    export_stage_metrics,
    torch_stage,
)
from omni_serve.models.qwen_image.stages import PromptEncoder
from omni_serve.transport import TensorRef, channel_stats


@serve.deployment
class TextEncoderDeployment(ReleasesSharedMemory):
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "text_encoder") -> None:
        setup = torch_stage(pipeline, stage_name)
        self.encoder = PromptEncoder(setup.model_path, setup.dtype, setup.device)
        self.channel = edge_channel(setup.config, stage_name)
        self.worker = StageWorker("text-encoder")
        self.prompts = 0
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def encode(self, prompts: list[str]) -> list[TensorRef]:
        rows = await self.worker.run(self.encoder.encode, prompts)
        self.prompts += len(prompts)
        return [self.channel.put(r.float()) for r in rows]

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "steps": self.prompts,
            "max_batch": 0,
            "running": 0,
            "run_s": self.worker.busy_s,
            "channel": channel_stats(),
        }
