"""The DiT replica's parallel workers: Ray actors, one per rank of an xfuser group, placed in
the replica's placement group (``StageConfig.serve_options``) and owned by it, so they live
and die with it. The replica sends each batch to every worker; rank 0's latents are the
answer, and a cancel goes to rank 0, which tells the others between two steps."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import ray

from deployments.common import pin_to_cores, stage_device
from omni_serve.config import DiTParallelSettings
from omni_serve.models.qwen_image.denoise import ImageJob

log = logging.getLogger("ray.serve")

CANCEL_POLL_S = 0.05
HEALTH_TIMEOUT_S = 10.0
# How long the other ranks may take to stop after one stopped (they stop at the same step).
GROUP_SETTLE_S = 10.0


class DenoiseWorker:
    """One rank. ``load(device=...)`` builds its denoiser after the group exists (its layers
    need it)."""

    def __init__(
        self,
        rank: int,
        settings: dict[str, Any],
        init_method: str,
        model_path: str,
        load: Callable[[], Any],
    ) -> None:
        from omni_serve.engines.diffusion.parallel import join_group

        parsed = DiTParallelSettings.model_validate(settings)
        pin_to_cores(parsed.cpu_cores[rank] if parsed.cpu_cores else None)
        join_group(rank, parsed, init_method, model_path)
        self.rank = rank
        self.denoiser = load(device=stage_device(parsed.worker_gpus))
        self.jobs: dict[str, list[ImageJob]] = {}
        # Batches cancelled before their run started here (the two calls race).
        self.cancelled: deque[str] = deque(maxlen=256)

    def run(self, batch_id: str, jobs: list[ImageJob]) -> list[Any] | None:
        self.jobs[batch_id] = jobs
        if batch_id in self.cancelled:
            self.cancel(batch_id)
        try:
            latents = self.denoiser.run(jobs)
        finally:
            self.jobs.pop(batch_id, None)
        return latents if self.rank == 0 else None

    def cancel(self, batch_id: str) -> None:
        """Runs beside ``run`` (two threads per actor)."""
        self.cancelled.append(batch_id)
        for job in self.jobs.get(batch_id, []):
            job.cancel.set()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class DenoiseWorkerGroup:
    """What the replica holds instead of a denoiser when its DiT runs on several workers."""

    def __init__(
        self, settings: DiTParallelSettings, model_path: str, load: Callable[[], Any]
    ) -> None:
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{_free_port()}"
        actor = ray.remote(DenoiseWorker).options(
            num_cpus=settings.worker_cpus,
            num_gpus=settings.worker_gpus,
            max_concurrency=2,
        )
        data = settings.model_dump()
        self.workers = [
            actor.remote(rank, data, init_method, model_path, load)
            for rank in range(settings.world_size)
        ]
        # Constructors return together once all ranks joined and loaded (or one failed).
        ray.get([w.__ray_ready__.remote() for w in self.workers])
        log.info(
            "DiT on %d workers (ulysses %d x cfg %d) over %s",
            settings.world_size,
            settings.ulysses_degree,
            settings.cfg_degree,
            init_method,
        )

    async def run(self, jobs: list[ImageJob]) -> list[Any]:
        batch_id = uuid.uuid4().hex
        shared = ray.put(jobs)  # one copy in the object store, read by every worker
        calls = [asyncio.ensure_future(w.run.remote(batch_id, shared)) for w in self.workers]
        watcher = asyncio.create_task(self._forward_cancel(batch_id, jobs))
        try:
            _, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # one rank failed: the others fail at the same step, or never
                _, pending = await asyncio.wait(pending, timeout=GROUP_SETTLE_S)
        finally:
            watcher.cancel()
        failures = [c.exception() for c in calls if c.done() and c.exception() is not None]
        died = [e for e in failures if isinstance(e, ray.exceptions.RayActorError)]
        if pending or died:
            # A rank died or failed alone: the others wait in a collective that never
            # completes, and a torch.distributed group cannot take a new member.
            self._exit_for_broken_group(died[0] if died else failures[0])
        if failures:  # every rank stopped at the same point (a cancel, bad input): still whole
            raise failures[0]
        results = [c.result() for c in calls]
        return results[0]

    async def _forward_cancel(self, batch_id: str, jobs: list[ImageJob]) -> None:
        while not all(job.cancel.is_set() for job in jobs):
            await asyncio.sleep(CANCEL_POLL_S)
        self.workers[0].cancel.remote(batch_id)

    async def check_health(self) -> None:
        """Workers answer beside a running batch (two threads each)."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(w.__ray_ready__.remote() for w in self.workers)),
                HEALTH_TIMEOUT_S,
            )
        except ray.exceptions.RayActorError as exc:
            self._exit_for_broken_group(exc)

    def _exit_for_broken_group(self, exc: BaseException) -> None:
        """Exiting lets Serve replace the replica (and with it the workers, which it owns) at
        once, and callers retry on the replacement, instead of every batch failing until
        Serve's health check notices."""
        log.error(
            "the DiT worker group broke; exiting so that Serve replaces this replica: %s", exc
        )
        logging.shutdown()
        os._exit(1)
