"""The playground: a page (plain HTML and JS in ``omni_serve/playground/``, no build step,
nothing fetched from elsewhere) that an ingress serves at ``/`` unless ``api.playground`` is
false. It talks to the same API as any client: ``/v1/realtime`` for voice, ``/v1/images/
generations`` for images, and ``/playground/config.json`` (behind the API key) for what the
app serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse

from omni_serve.api.errors import ApiError

PAGE_DIR = Path(__file__).parents[1] / "playground"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "worklets.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}


class _Page:
    enabled = False
    config: dict[str, Any] = {}


def configure(
    enabled: bool, kind: str, model: str, voices: list[str] | None = None, **extra: Any
) -> None:
    """Set per ingress replica (Serve serves a copy of the app object). ``kind``: "speech"
    (the voice panel) or "image" (the image panel); ``extra``: what the panel offers."""
    _Page.enabled = enabled
    _Page.config = {"kind": kind, "model": model, "voices": sorted(voices or []), **extra}


def is_page_path(path: str) -> bool:
    return path == "/" or (path.startswith("/playground/") and path[12:] in FILES)


def page_file(name: str) -> FileResponse:
    if not _Page.enabled:
        raise ApiError(404, "the playground is off (api.playground: false in the pipeline config)")
    if name not in FILES:
        raise ApiError(404, f"no playground file {name!r}")
    return FileResponse(
        PAGE_DIR / name, media_type=FILES[name], headers={"cache-control": "no-cache"}
    )


def add_routes(app: FastAPI) -> None:
    """``/``, the page's files, and its config, on an ingress's FastAPI app."""

    @app.get("/", include_in_schema=False)
    async def playground_page() -> FileResponse:
        return page_file("index.html")

    @app.get("/playground/config.json", include_in_schema=False)
    async def playground_config() -> JSONResponse:
        if not _Page.enabled:
            raise ApiError(404, "the playground is off (api.playground: false)")
        return JSONResponse(_Page.config)

    @app.get("/playground/{name}", include_in_schema=False)
    async def playground_file(name: str) -> FileResponse:
        return page_file(name)
