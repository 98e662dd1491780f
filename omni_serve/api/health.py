"""Stage health as the ingress reports it on ``/health``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse

HEALTH_TIMEOUT_S = 2.0


async def stage_health(
    handles: dict[str, Any], timeout_s: float = HEALTH_TIMEOUT_S
) -> JSONResponse:
    """200 when every stage's ``ready()`` answers; 503 naming the stages that do not (yet)."""

    async def ping(name: str) -> str | None:
        try:
            await asyncio.wait_for(handles[name].ready.remote(), timeout_s)
        except Exception as exc:
            return f"{name}: {type(exc).__name__}"
        return None

    problems = [p for p in await asyncio.gather(*map(ping, handles)) if p]
    if problems:
        return JSONResponse({"status": "unavailable", "stages": problems}, status_code=503)
    return JSONResponse({"status": "ok", "stages": sorted(handles)})
