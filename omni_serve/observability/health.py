"""Stage health as the ingress reports it on ``/health``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

HEALTH_TIMEOUT_S = 2.0
log = logging.getLogger(__name__)


async def stage_health(
    handles: dict[str, Any],
    timeout_s: float = HEALTH_TIMEOUT_S,
    explain: Callable[[], dict[str, str]] | None = None,
    degraded: dict[str, str] | None = None,
) -> JSONResponse:
    """200 when every stage's ``ready()`` answers; 503 naming the stages that do not (yet),
    with ``reasons``: what ``explain`` (blocking; Serve's deployment status) says about them.
    ``degraded``: parts that work with less than they should (still a 200), and why."""

    async def ping(name: str) -> str | None:
        try:
            ready = await asyncio.wait_for(handles[name].ready.remote(), timeout_s)
        except Exception as exc:
            return f"{name}: {type(exc).__name__}"
        return None if ready is not False else f"{name}: engine not running"

    problems = [p for p in await asyncio.gather(*map(ping, handles)) if p]
    if problems:
        body: dict[str, Any] = {"status": "unavailable", "stages": problems}
        if degraded:
            body["degraded"] = degraded
        if explain is not None:
            body["reasons"] = await _reasons(explain, {p.split(":")[0] for p in problems})
        return JSONResponse(body, status_code=503)
    body = {"status": "ok", "stages": sorted(handles)}
    if degraded:
        body["degraded"] = degraded
    return JSONResponse(body)


async def _reasons(explain: Callable[[], dict[str, str]], stages: set[str]) -> dict[str, str]:
    try:
        said = await asyncio.wait_for(asyncio.to_thread(explain), HEALTH_TIMEOUT_S)
    except Exception as exc:  # health must answer even when the explanation does not
        log.warning("no deployment status for /health: %s", exc)
        return {}
    return {name: reason for name, reason in said.items() if name in stages}
