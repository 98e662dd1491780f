"""What every stage deployment does the same way: read its slice of the pipeline config."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_serve import transport
from omni_serve.config import EdgeConfig, PipelineConfig, StageConfig
from omni_serve.models import resolve_model
from omni_serve.transport import Channel, announce, make_channel

if TYPE_CHECKING:
    import torch
    from fastapi import FastAPI


def stage_setup(
    pipeline: dict[str, Any], stage_name: str
) -> tuple[PipelineConfig, StageConfig, Path]:
    """Also records this node's host id before the replica can be sent anything, so that a
    producer elsewhere knows whether this replica can map its shared memory (a stage that
    only consumes, like the Talker, makes no channel of its own to record it)."""
    announce()
    config = PipelineConfig.model_validate(pipeline)
    return config, config.stage(stage_name), resolve_model(config.model)


class ReleasesSharedMemory:
    """Base of every stage deployment. Serve calls ``__del__`` when it stops a replica
    gracefully (Ctrl-C on ``serve run``, a scale-down, a redeploy), then ends the process
    without exit handlers: the replica's shared-memory segments go here, instead of staying in
    /dev/shm (memory) until another producer on the host sweeps them. A stage with more to stop
    calls this last. Only in a Serve replica: an object built by hand (a test's, an actor's)
    shares its process's pool with others."""

    def __del__(self) -> None:
        if in_serve_replica():
            transport.close()


def export_stage_metrics(stage: str, stats: Callable[[], Any]) -> asyncio.Task | None:
    """In a Serve replica, starts exporting this replica's stage series (from ``stats()``)
    through Ray's metrics export, where every replica of a stage shows, unlike on the
    ingress's ``/metrics``. Keep the task: the loop holds the only reference. Elsewhere (a
    stage built by hand in a test) it does nothing."""
    from omni_serve.observability.stage_metrics import export_stage_stats

    if not in_serve_replica():
        return None
    return asyncio.get_running_loop().create_task(export_stage_stats(stage, stats))


def ingress_stats() -> dict[str, Any]:
    """An ingress's own ``stats()``: its channel counts (the audio and images it reads)."""
    return {"channel": transport.channel_stats()}


def in_serve_replica() -> bool:
    """Whether this code runs in a replica Serve started (it has a replica context)."""
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        serve.get_replica_context()
    except RayServeException:
        return False
    return True


@dataclass
class TorchStage:
    """A torch stage's slice of the pipeline config, resolved into what it loads its model
    with."""

    config: PipelineConfig
    stage: StageConfig
    model_path: Path
    dtype: torch.dtype
    device: str


def torch_stage(pipeline: dict[str, Any], stage_name: str) -> TorchStage:
    """Every torch stage starts the same way: its config, its threads on its cores, and the
    dtype and device its model loads with."""
    config, stage, model_path = stage_setup(pipeline, stage_name)
    pin_to_cores(stage.deployment.cpu_cores)
    device = stage_device(stage.deployment.ray_actor_options.num_gpus)
    return TorchStage(config, stage, model_path, stage_dtype(stage), device)


def ingress_app(title: str) -> FastAPI:
    """The FastAPI app of an ingress, with the routes every ingress shares: OpenAI-shaped
    errors, the API key check, then the body limit (middleware added last runs first: no body
    is read for a client without the key).
    ``configure_http_guards`` sets their values per replica."""
    from fastapi import FastAPI

    from deployments.shared_routes import add_shared_routes
    from omni_serve.api import playground
    from omni_serve.api.access import ApiKeyMiddleware
    from omni_serve.api.body_limit import BodyLimitMiddleware
    from omni_serve.api.errors import install_error_handlers

    app = FastAPI(title=title, version="0.1.0")
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(ApiKeyMiddleware)
    install_error_handlers(app)
    playground.add_routes(app)
    add_shared_routes(app)
    return app


def configure_http_guards(config: PipelineConfig) -> None:
    """Set this ingress replica's request guards: the API key (refuses to start an open API on
    a non-loopback address) and the request body limit."""
    from omni_serve.api import access, body_limit
    from omni_serve.compat.ray_serve import proxy_host

    access.configure(access.resolve_api_key(config.api, proxy_host()))
    body_limit.configure(config.api.max_request_bytes)


def serve_problems() -> dict[str, str]:
    """Serve's own account of each deployment of this app that is not healthy (e.g. why its
    replica failed to start), for /health. Blocking (a controller call): run it in a thread."""
    from ray import serve

    app = serve.status().applications.get(serve.get_replica_context().app_name)
    if app is None:
        return {}
    return {
        name: _last_lines(f"{d.status}: {d.message}")
        for name, d in app.deployments.items()
        if d.status != "HEALTHY" and d.message
    }


def _last_lines(text: str, max_chars: int = 600) -> str:
    """The whole lines at the end of ``text``: the end of a traceback says what went wrong."""
    if len(text) <= max_chars:
        return text
    return text[-max_chars:].split("\n", 1)[-1]


def stage_dtype(stage: StageConfig) -> torch.dtype:
    """The torch dtype a stage's engine asks for (float32 on CPU by default)."""
    import torch

    return getattr(torch, stage.engine.dtype if stage.engine else "float32")


def stage_device(gpus: float) -> str:
    """Where a torch stage runs: on its GPU when it reserves one (Ray then makes it visible as
    cuda:0), else on the CPU."""
    import torch

    return "cuda" if gpus > 0 and torch.cuda.is_available() else "cpu"


def find_edge(
    config: PipelineConfig, source: str, payload: str | None = None, target: str | None = None
) -> EdgeConfig | None:
    """The first edge out of ``source`` (carrying ``payload``, toward ``target``, when given)."""
    for edge in config.edges:
        wanted = payload in (None, edge.payload) and target in (None, edge.target)
        if edge.source == source and wanted:
            return edge
    return None


def edge_channel(
    config: PipelineConfig, source: str, payload: str | None = None, target: str | None = None
) -> Channel:
    """The tensor channel for what ``source`` sends downstream (its edge's settings; the
    defaults where the config names no such edge). A GPU payload stays on the GPU only when
    the target stage reserves one (the ingress has none)."""
    edge = find_edge(config, source, payload, target)
    if edge is None:
        return make_channel()
    gpu_consumer = config.stage(edge.target).deployment.ray_actor_options.num_gpus > 0
    return make_channel(edge.channel.backend, edge.channel.inline_max_bytes, gpu_consumer)


def pin_to_cores(cores: list[int] | None) -> None:
    """Keep a torch stage's threads on its configured cores (so stages do not share one),
    with one intra-op thread per core (more threads than cores only thrash here)."""
    import os

    import torch

    from omni_serve.engines.cpu_cores import usable_cores

    wanted = usable_cores(cores)
    if wanted:
        os.sched_setaffinity(0, wanted)
    torch.set_num_threads(max(1, len(wanted or cores or [0])))


class StageWorker:
    """One thread per replica for blocking torch work, so the replica's event loop keeps
    answering health checks and queueing requests while a model runs. ``busy_s``: seconds
    spent running work so far (the stage's busy time on /metrics)."""

    def __init__(self, name: str) -> None:
        import concurrent.futures

        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self.busy_s = 0.0

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._timed, fn, args
        )

    def _timed(self, fn: Callable[..., Any], args: tuple) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.busy_s += time.perf_counter() - began
