"""API errors: every rejected request gets an OpenAI-shaped body and a 4xx with the reason."""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from omni_serve.api.protocol import error_body


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
        self.message, self.type, self.headers = message, type_, headers


class StageUnavailable(Exception):
    """A stage refused a request: its replicas and queue are full (Serve backpressure), or it
    has no replica running. The client should come back later; nothing was generated."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def stage_failure(exc: BaseException) -> ApiError:
    """What a client hears when a stage could not serve its request: 503 with Retry-After when
    the stage is at capacity (retry), 500 naming the failure otherwise."""
    if isinstance(exc, StageUnavailable):
        retry = exc.retry_after_s
        headers = {"Retry-After": str(max(0, math.ceil(retry)))} if retry is not None else None
        return ApiError(503, str(exc), type_="server_error", code="overloaded", headers=headers)
    message = f"generation failed: {type(exc).__name__}: {exc}"[:500]
    return ApiError(500, message, type_="server_error")


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("request body is not valid JSON"), status_code=400)
    where = ".".join(str(p) for p in first["loc"] if p != "body") or None
    message = f"{where}: {first['msg']}" if where else first["msg"]
    return JSONResponse(error_body(message, param=where), status_code=400)


def install_error_handlers(app: FastAPI) -> None:
    """400 (not FastAPI's 422) for malformed bodies, with the failing field named."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
