"""API errors: every rejected request gets an OpenAI-shaped body and a 4xx with the reason."""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from omni_serve.api.protocol import ChatCompletionRequest, error_body
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.validation_errors import most_specific


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
        self.message, self.type, self.param, self.headers = message, type_, param, headers


class ContextOverflow(ApiError):
    """A 400: the prompt, with room for the answer, is longer than the model's context.
    Carries the counts, so a caller that may shorten the prompt (a Realtime session's
    truncation) knows by how much."""

    def __init__(self, prompt_tokens: int, context_tokens: int, reply_room: int = 1) -> None:
        self.prompt_tokens, self.fits = prompt_tokens, context_tokens - reply_room
        message = (
            f"the prompt is {prompt_tokens} tokens; this model's context is "
            f"{context_tokens} tokens, prompt and reply together"
        )
        if reply_room > 1:
            message += f", and the answer may take {reply_room}"
        super().__init__(400, message, "messages", code="context_length_exceeded")


def check_model(requested: str | None, served: str) -> None:
    """A 404 naming the served model when a request names another (None: it named none)."""
    if requested is not None and requested != served:
        message = f"model {requested!r} does not exist; this server serves {served!r}"
        raise ApiError(404, message, "model", code="model_not_found")


def refuse_unsupported(body: ChatCompletionRequest | SpeechRequest) -> None:
    """A 400 for an OpenAI setting this server does not honour, for every chat and speech
    route."""
    unsupported = body.unsupported()
    if unsupported:
        raise ApiError(400, unsupported[1], unsupported[0])


class StageUnavailable(Exception):
    """A stage refused a request: its replicas and queue are full (Serve backpressure), or it
    has no replica running. The client should come back later; nothing was generated."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StageRejectedInput(ValueError):
    """A stage found the request invalid where the ingress could not tell (e.g. a prompt whose
    media expand past the Thinker's context): the client's mistake, answered 400 with the
    stage's reason. Stages raise it; through Ray it arrives as a RayTaskError that is also
    an instance of this class."""


class ReplicaDied(Exception):
    """A stage replica died (crash, OOM kill, node loss) while it worked on the request, after
    part of the answer was out. Serve replaces the replica; the request can be sent again."""

    RETRY_AFTER_S = 5.0  # about what a tiny stage takes to come back; large ones take longer

    def __init__(self, stage: str | None) -> None:
        which = f"stage {stage!r}" if stage else "a stage"
        super().__init__(
            f"a replica of {which} died during the request; Serve is replacing it, "
            "send the request again"
        )
        self.stage = stage


def _retry_after(seconds: float | None) -> dict[str, str] | None:
    return {"Retry-After": str(max(0, math.ceil(seconds)))} if seconds is not None else None


def stage_failure(exc: BaseException) -> ApiError:
    """What a client hears when a stage could not serve its request: 503 with Retry-After when
    the stage is at capacity or lost its replica (retry), 400 when it rejected the input, 500
    naming the failure otherwise."""
    if isinstance(exc, StageUnavailable):
        headers = _retry_after(exc.retry_after_s)
        return ApiError(503, str(exc), type_="server_error", code="overloaded", headers=headers)
    if isinstance(exc, StageRejectedInput):
        return ApiError(400, str(exc.args[0] if exc.args else exc)[:500])
    if isinstance(exc, ReplicaDied):
        headers = _retry_after(exc.RETRY_AFTER_S)
        return ApiError(503, str(exc), type_="server_error", code="replica_died", headers=headers)
    message = f"generation failed: {type(exc).__name__}: {exc}"[:500]
    return ApiError(500, message, type_="server_error")


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule (0.136, ``strict_content_type`` on) for parsing a body as JSON:
    application/json or a ``+json`` subtype. With no content type a body is not parsed, so
    that a web page cannot post to a server on localhost without a CORS preflight."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    content_type = request.headers.get("content-type")
    if tuple(first["loc"]) == ("body",) and not _is_json(content_type):
        # FastAPI hands a body of another type to the model as bytes, whose error ("Input
        # should be a valid dictionary") hides the cause; curl -d sends form encoding.
        sent = f"not {content_type!r}" if content_type else "this request sent none"
        message = f"the body must be JSON sent with content-type: application/json ({sent})"
        return JSONResponse(error_body(message, code="unsupported_media_type"), status_code=415)
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("request body is not valid JSON"), status_code=400)
    error = most_specific(exc.errors(), skip=1 if tuple(first["loc"][:1]) == ("body",) else 0)
    return JSONResponse(error_body(error.message, param=error.param), status_code=400)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own answers (no such route, a method the route does not take) in the shape
    every other error has, saying what the server does take."""
    method, path = request.method, request.url.path
    if exc.status_code == 404:
        message = f"no route {method} {path} on this server; it has {_routes(request.app)}"
        code = "not_found"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "other methods")
        message, code = f"{path} takes {allowed}, not {method}", "method_not_allowed"
    else:
        message, code = str(exc.detail), None
    body = error_body(message, code=code)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def _routes(app: FastAPI) -> str:
    """The API's routes, ``METHOD /path``: the generated docs' own routes left out."""
    routes = [
        f"{method} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods - {"HEAD"})
    ]
    return ", ".join(sorted(routes, key=lambda r: r.split(" ", 1)[::-1]))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug's 500 in the shape every other error has (Starlette's own is plain text). The
    exception is still raised on after this answer, so the replica's log has its traceback."""
    message = f"internal error: {type(exc).__name__}: {exc}"[:500]
    return JSONResponse(error_body(message, "server_error"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: 400 (not FastAPI's 422) for malformed bodies, with the
    failing field named; 404 and 405 naming the routes and methods there are; a 500 too."""
    app.add_exception_handler(Exception, _unexpected)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
