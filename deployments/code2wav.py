"""Codec stage: batched decode of chunk jobs to 24 kHz PCM, with the family's codec (Qwen3-Omni's
Code2wav, Qwen2.5-Omni's Token2Wav). Each chunk goes back on
the tensor channel: a steady 2 s chunk is 188 KB, past what Ray returns inline, so as a
pickled return value it went through the object store (a call returning one, two-actor probe,
medians of 55: 2.5-3.6 ms pickled, 2.1-2.2 ms as a channel ref taken and copied out)."""

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
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob
from omni_serve.models.registry import thinker_talker_family
from omni_serve.transport import TensorRef, channel_stats


@serve.deployment
class Code2WavDeployment(ReleasesSharedMemory):
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "code2wav") -> None:
        setup = torch_stage(pipeline, stage_name)
        stage = setup.stage
        family = thinker_talker_family(setup.config.family)
        self.codec, self.info = family.load_codec(
            setup.model_path, setup.dtype, setup.device, stage.engine
        )
        self.decode_batched.set_max_batch_size(stage.engine.max_batch_size)
        self.channel = edge_channel(setup.config, stage_name)
        # Decodes run on their own thread: a Token2Wav window takes seconds, and on the event
        # loop it would hold back the next chunk's call, health checks and ``stats()``.
        self.worker = StageWorker("codec")
        self.batches = 0
        self.max_batch = 0
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    def codec_info(self) -> CodecInfo:
        return self.info

    async def decode(self, jobs: list[DecodeJob]) -> list[TensorRef]:
        """One channel ref per job: its float32 PCM."""
        return [self.channel.put(audio) for audio in await self.decode_batched(jobs)]

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def decode_batched(self, requests: list[list[DecodeJob]]) -> list[list[torch.Tensor]]:
        return await self.decode_together(requests)

    async def decode_together(self, requests: list[list[DecodeJob]]) -> list[list[torch.Tensor]]:
        """Jobs of concurrent callers decode as one padded batch (causal codec: exact)."""
        flat = [job for jobs in requests for job in jobs]
        self.batches += 1
        self.max_batch = max(self.max_batch, len(requests))
        audio = list(await self.worker.run(self.codec.run, flat))
        out, i = [], 0
        for jobs in requests:
            out.append(audio[i : i + len(jobs)])
            i += len(jobs)
        return out

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        streams = self.codec.streams
        return {
            "steps": self.batches,
            "max_batch": self.max_batch,
            "running": 0,
            "decode_s": round(self.worker.busy_s, 3),
            "stream_state_hits": streams.hits if streams is not None else 0,
            "stream_state_misses": streams.misses if streams is not None else 0,
            "channel": channel_stats(),
        }
