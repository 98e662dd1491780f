"""DiT stage (Qwen-Image): owns the denoising loop. Concurrent requests of the same size share
each transformer call (each request's CFG branches included): by default the batch is re-formed
before every step (a request joins at the next step); with cache-dit or a parallel DiT, requests
that arrive together (same size and step count) run as one batch to the end."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import defaultdict
from typing import Any

from ray import serve

from deployments.common import (
    ReleasesSharedMemory,
    StageWorker,
    edge_channel,
    export_stage_metrics,
    torch_stage,
)
from deployments.dit_workers import DenoiseWorkerGroup
from omni_serve.engines.diffusion.step_batching import StepBatcher
from omni_serve.models.qwen_image.denoise import DenoiseCancelled, DenoiseState, ImageJob
from omni_serve.models.qwen_image.messages import DenoiseRequest
from omni_serve.models.qwen_image.parallel import load_parallel_denoiser
from omni_serve.models.qwen_image.stages import load_denoiser
from omni_serve.transport import TensorRef, channel_stats, take

log = logging.getLogger("ray.serve")


@serve.deployment
class DiTDeployment(ReleasesSharedMemory):
    def __init__(self, pipeline: dict[str, Any], stage_name: str = "dit") -> None:
        setup = torch_stage(pipeline, stage_name)
        stage, model_path = setup.stage, setup.model_path
        parallel = stage.engine.parallel
        self.group: DenoiseWorkerGroup | None = None
        if parallel is not None and parallel.world_size > 1:
            # The workers hold the transformer; this replica batches and hands batches over.
            load = functools.partial(load_parallel_denoiser, model_path, setup.dtype)
            self.group = DenoiseWorkerGroup(parallel, str(model_path), load)
            self.denoiser = None
        else:
            self.denoiser = load_denoiser(
                model_path, setup.dtype, stage.engine.step_cache, setup.device
            )
        self.channel = edge_channel(setup.config, stage_name)
        self.steps: StepBatcher | None = None
        if self.group is None and stage.engine.step_batching:
            self.steps = StepBatcher(
                self.denoiser, stage.engine.max_batch_size, result=_host_latents, logger=log
            )
        elif self.group is None:
            self.worker = StageWorker("dit")
        self.denoise_batched.set_max_batch_size(stage.engine.max_batch_size)
        self.batches = 0
        self.max_batch = 0
        self.running = 0
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def denoise(self, request: DenoiseRequest) -> list[TensorRef]:
        """Packed latents, one ref per seed of the request."""
        prompt = await take(request.prompt)
        negative = await take(request.negative) if request.negative is not None else None
        jobs = [
            ImageJob(
                prompt,
                request.height,
                request.width,
                request.steps,
                seed,
                negative_embeds=negative,
                true_cfg_scale=request.true_cfg_scale,
            )
            for seed in request.seeds
        ]
        # The request's n images join the same batch (and other requests' images with them).
        denoise = self.denoise_batched if self.steps is None else self._denoise_stepped
        try:
            latents = await asyncio.gather(*(denoise(job) for job in jobs))
        except asyncio.CancelledError:  # the caller went away: stop its steps
            for job in jobs:
                job.cancel.set()
            raise
        return [self.channel.put(lat) for lat in latents]

    async def _denoise_stepped(self, job: ImageJob) -> Any:
        return await asyncio.wrap_future(self.steps.submit(job))

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def denoise_batched(self, jobs: list[ImageJob]) -> list[Any]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, job in enumerate(jobs):
            groups[job.shape_key].append(i)
        out: list[Any] = [None] * len(jobs)
        for key, members in groups.items():
            log.info(
                "DiT batch of %d image(s), size %dx%d, %d steps",
                len(members),
                key[1],
                key[0],
                key[2],
            )
            self.running += len(members)
            try:
                latents = await self._denoise([jobs[i] for i in members])
            except DenoiseCancelled:
                log.info("DiT batch cancelled: nobody waits for its %d image(s)", len(members))
                continue
            finally:
                self.running -= len(members)
            if self.denoiser is not None and self.denoiser.step_cache is not None:
                log.info(
                    "DiT batch took %d of %d steps from the step cache",
                    self.denoiser.last_cached_steps,
                    key[2],
                )
            for i, lat in zip(members, latents, strict=True):
                out[i] = lat
            self.batches += 1
            self.max_batch = max(self.max_batch, len(members))
        return out

    async def _denoise(self, jobs: list[ImageJob]) -> list[Any]:
        if self.group is not None:
            return await self.group.run(jobs)
        return await self.worker.run(self.denoiser.run, jobs)

    async def ready(self) -> bool:
        return True

    async def check_health(self) -> None:
        if self.group is not None:
            await self.group.check_health()

    def stats(self) -> dict[str, Any]:
        if self.steps is not None:
            stats = self.steps.stats
            return {
                "steps": stats.steps,
                "max_batch": stats.max_batch,
                "running": self.steps.active,
                "joined_running": stats.joined_running,
                "run_s": stats.busy_s,
                "channel": channel_stats(),
            }
        busy = {"run_s": self.worker.busy_s} if self.group is None else {}
        return {
            "steps": self.batches,
            "max_batch": self.max_batch,
            "running": self.running,
            **busy,
            "channel": channel_stats(),
        }

    def __del__(self) -> None:
        if getattr(self, "steps", None) is not None:
            self.steps.close()
        super().__del__()


def _host_latents(state: DenoiseState) -> Any:
    return state.latents.cpu()  # the channel carries host tensors
