"""Ingress: the OpenAI-compatible HTTP API, orchestrating the stage deployments."""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from omni_serve.api.audio_codec import encode_audio
from omni_serve.api.media import MediaError
from omni_serve.api.protocol import ChatCompletionRequest, chat_completion_response, error_body
from omni_serve.config import PipelineConfig
from omni_serve.models import resolve_model
from omni_serve.models.qwen3_omni.codec import SAMPLE_RATE
from omni_serve.models.qwen3_omni.pipeline import run_chat
from omni_serve.models.qwen3_omni.request import prepare_prompt

app = FastAPI(title="omni-serve", version="0.1.0")
log = logging.getLogger("ray.serve")


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


@app.exception_handler(ApiError)
async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status)


@app.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("request body is not valid JSON"), status_code=400)
    where = ".".join(str(p) for p in first["loc"] if p != "body") or None
    message = f"{where}: {first['msg']}" if where else first["msg"]
    return JSONResponse(error_body(message, param=where), status_code=400)


def _talker_overrides(body: ChatCompletionRequest) -> dict[str, Any]:
    overrides = body.stage_overrides.talker if body.stage_overrides else None
    if overrides is None:
        return {}
    return overrides.model_dump(exclude_none=True)


class _HandleClients:
    """``StageClients`` over Serve handles."""

    def __init__(self, thinker: DeploymentHandle, talker: DeploymentHandle,
                 code2wav: DeploymentHandle) -> None:  # fmt: skip
        self._thinker = thinker.options(stream=True)
        self._talker = talker.options(stream=True)
        self._code2wav = code2wav

    def thinker(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return self._thinker.generate.remote(request)

    def talker(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return self._talker.generate.remote(request)

    async def code2wav(self, codes: Any) -> np.ndarray:
        return await self._code2wav.decode.remote(codes)


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, pipeline: dict[str, Any], thinker: DeploymentHandle,
                 talker: DeploymentHandle, code2wav: DeploymentHandle) -> None:  # fmt: skip
        from transformers import AutoProcessor

        self.config = PipelineConfig.model_validate(pipeline)
        model_path = resolve_model(self.config.model)
        self.processor = AutoProcessor.from_pretrained(model_path)
        from omni_serve.models.qwen3_omni.checkpoint import load_config

        self.voices = set(load_config(model_path).talker_config.speaker_id)
        self.clients = _HandleClients(thinker, talker, code2wav)
        self.stage_handles = {"thinker": thinker, "talker": talker, "code2wav": code2wav}
        self.created = int(time.time())

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        name = self.config.served_model_name
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "omni-serve"}
        ]}  # fmt: skip

    @app.get("/health")
    async def health(self) -> JSONResponse:
        return JSONResponse({"status": "ok", "stages": sorted(self.stage_handles)})

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> JSONResponse:
        api = self.config.api
        if body.model != self.config.served_model_name:
            served = self.config.served_model_name
            message = f"model {body.model!r} does not exist; this server serves {served!r}"
            raise ApiError(404, message, "model", code="model_not_found")
        if body.stream:
            raise ApiError(400, "stream=true is not supported yet", "stream")
        max_tokens = body.max_completion_tokens or body.max_tokens or api.default_max_tokens
        if max_tokens > api.max_tokens_limit:
            raise ApiError(400, f"max_tokens must be <= {api.max_tokens_limit}", "max_tokens")
        want_audio = "audio" in body.modalities
        audio_opts = body.audio
        if want_audio and audio_opts is None:
            raise ApiError(400, "modalities includes 'audio': give audio {voice, format}", "audio")
        try:
            prompt = prepare_prompt(self.processor, body.messages, api)
        except MediaError as exc:
            raise ApiError(400, str(exc), exc.param) from None
        sampling = {"max_tokens": max_tokens, "temperature": body.temperature,
                    "top_p": body.top_p, "seed": body.seed}  # fmt: skip
        voice = audio_opts.voice if audio_opts else "ethan"
        if want_audio and voice.lower() not in self.voices:
            raise ApiError(400, f"unknown voice {voice!r}; voices: {sorted(self.voices)}",
                           "audio.voice")  # fmt: skip
        try:
            result = await run_chat(
                self.clients, prompt, sampling, want_audio, voice, uuid.uuid4().hex,
                talker_sampling=_talker_overrides(body),
            )  # fmt: skip
        except Exception as exc:  # a stage failed: say so, in the API's error shape
            log.exception("chat request failed in a stage")
            raise ApiError(500, f"generation failed: {type(exc).__name__}: {exc}"[:500],
                           type_="server_error") from None  # fmt: skip
        audio = None
        if want_audio and result.audio is not None:
            data = encode_audio(result.audio, SAMPLE_RATE, audio_opts.format)
            audio = {"id": f"audio-{uuid.uuid4().hex[:16]}",
                     "data": base64.b64encode(data).decode(),
                     "expires_at": int(time.time()) + 3600, "transcript": result.text}  # fmt: skip
        usage = {"prompt_tokens": result.prompt_tokens,
                 "completion_tokens": len(result.token_ids),
                 "total_tokens": result.prompt_tokens + len(result.token_ids)}  # fmt: skip
        response = chat_completion_response(
            self.config.served_model_name, result.text, audio, result.finish_reason, usage
        )
        return JSONResponse(response)
