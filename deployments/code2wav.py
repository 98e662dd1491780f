"""Code2wav stage: batched codec decode to 24 kHz PCM."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ray import serve

from deployments.common import stage_setup
from omni_serve.engines.codec.chunked import ChunkPlanner
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder


@serve.deployment
class Code2WavDeployment:
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "code2wav") -> None:
        torch.set_num_threads(1)
        _, _, model_path = stage_setup(pipeline, stage_name)
        self.codec, self.left_context = load_code2wav_decoder(model_path)

    async def decode(self, frames: list[torch.Tensor]) -> np.ndarray:
        codes = torch.stack(frames, dim=1)  # [Q, T]
        planner = ChunkPlanner(self.codec.samples_per_frame, left_context=self.left_context)
        jobs = planner.push(codes)
        last = planner.finish()
        audio = self.codec.run(jobs + ([last] if last else []))
        return torch.cat(audio).numpy()
