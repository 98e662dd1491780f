"""Handle calls that cancel the downstream request when the caller stops waiting.

Serve cancels a replica's child requests when the replica's own request is cancelled (a client
disconnect), but not when only a task inside it is (a server-side deadline): without these
wrappers a timed-out request would go on running in every stage behind the ingress.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ray.serve.handle import DeploymentResponse, DeploymentResponseGenerator


async def call(response: DeploymentResponse) -> Any:
    try:
        return await response
    except asyncio.CancelledError:
        response.cancel()
        raise


async def stream(responses: DeploymentResponseGenerator) -> AsyncIterator[Any]:
    finished = False
    try:
        async for item in responses:
            yield item
        finished = True
    finally:  # cancelled, closed early, or failed: stop the stage's work on it
        if not finished:
            responses.cancel()
