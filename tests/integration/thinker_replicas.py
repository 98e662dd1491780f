"""Thinker stage replicas built in the test process (no Serve), two of one pipeline, as the
session KV stories need them: a turn on one replica, the next on the other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from deployments.thinker import ThinkerDeployment
from omni_serve.config.loading import load_pipeline_config


async def new_replica(pipeline: dict) -> ThinkerDeployment:
    cls = ThinkerDeployment.func_or_class
    replica = object.__new__(cls)
    await cls.__init__(replica, pipeline)
    return replica


async def two_replicas(config: Path, model: Path) -> AsyncIterator[tuple]:
    """Two replicas of ``config``'s Thinker on ``model``, their session KV on shared memory
    (the tiny models' blocks would ride inline); stopped when the caller is done."""
    pipeline = load_pipeline_config(config).model_dump()
    pipeline["model"] = str(model)
    for edge in pipeline["edges"]:
        if edge["payload"] == "session_kv":
            edge["channel"]["backend"] = "shared_memory"
    first, second = await new_replica(pipeline), await new_replica(pipeline)
    yield first, second
    for replica in (first, second):
        replica._watchdog.cancel()  # else it exits this process when the engine stops
        await replica.engine.shutdown()
