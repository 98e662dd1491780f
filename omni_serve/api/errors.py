"""API errors: every rejected request gets an OpenAI-shaped body and a 4xx with the reason."""

from __future__ import annotations

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
    ) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status)


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
