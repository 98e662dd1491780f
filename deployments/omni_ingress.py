"""The omni ingress: the OpenAI-compatible HTTP API over a Thinker-Talker family's stages.

Its routes are split by API (chat here, ``AudioRoutes``, ``VoiceSocketRoutes``,
``RealtimeRoutes``), all over one chat path (``OmniChat``); ``/v1/models``, ``/health`` and
``/metrics`` are every ingress's (``shared_routes``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.audio_routes import AudioRoutes
from deployments.common import (
    ReleasesSharedMemory,
    configure_http_guards,
    edge_channel,
    export_stage_metrics,
    in_serve_replica,
    ingress_stats,
)
from deployments.omni_api import app
from deployments.omni_chat import OmniChat
from deployments.omni_stage_clients import HandleStageClients
from deployments.realtime_routes import RealtimeRoutes
from deployments.session_store import SessionStoreClient
from deployments.spoken_reply_store import SpokenReplyClient
from deployments.voice_socket_routes import VoiceSocketRoutes
from omni_serve.api import playground
from omni_serve.api.protocol import (
    ChatCompletionRequest,
    chat_completion_response,
    new_id,
    reply_usage,
)
from omni_serve.api.sse import ChunkWriter
from omni_serve.config import PipelineConfig
from omni_serve.engines.ar.vllm_engine import DEFAULT_ENGINE_ARGS
from omni_serve.media.audio_codec import encode_audio
from omni_serve.models import resolve_model
from omni_serve.models.registry import thinker_talker_family
from omni_serve.models.thinker_talker.family import SAMPLE_RATE
from omni_serve.models.thinker_talker.prompt_worker import PromptWorker
from omni_serve.observability.metrics import ApiMetrics

log = logging.getLogger("ray.serve")


# Keep module-level helpers ABOVE this class: Serve pickles the class by value when the
# decorator runs, so a global defined below it is missing in the replica (NameError).
@serve.deployment
@serve.ingress(app)
class OmniIngress(AudioRoutes, VoiceSocketRoutes, RealtimeRoutes, ReleasesSharedMemory):
    def __init__(
        self,
        pipeline: dict[str, Any],
        thinker: DeploymentHandle,
        talker: DeploymentHandle | None,
        code2wav: DeploymentHandle | None,
        encoder: DeploymentHandle | None = None,
        session_store: DeploymentHandle | None = None,
        spoken_replies: DeploymentHandle | None = None,
    ) -> None:
        from transformers import AutoProcessor

        self.config = PipelineConfig.model_validate(pipeline)
        configure_http_guards(self.config)
        model_path = resolve_model(self.config.model)
        # Without a Talker (a text-only pipeline: the Thinking and Captioner checkpoints have
        # none) the app answers in text and refuses audio output.
        family = thinker_talker_family(self.config.family)
        self.transcription = family.transcription
        voices = set(family.voices(model_path)) if talker else set()
        playground.configure(
            self.config.api.playground, "speech", self.config.served_model_name, sorted(voices)
        )
        self.handles = {"thinker": thinker}
        for name, handle in (("talker", talker), ("code2wav", code2wav), ("encoder", encoder)):
            if handle is not None:
                self.handles[name] = handle
        clients = HandleStageClients(
            self.handles,
            edge_channel(self.config, "ingress", "media", target="encoder"),
            edge_channel(self.config, "ingress", "media", target="thinker"),
        )
        thinker_engine = self.config.stage("thinker").engine
        args = {**DEFAULT_ENGINE_ARGS, **(thinker_engine.args if thinker_engine else {})}
        self.metrics = ApiMetrics(to_ray=in_serve_replica())
        self.chat = OmniChat(
            self.config,
            PromptWorker(AutoProcessor.from_pretrained(model_path), self.config.api, family),
            clients,
            self.metrics,
            voices=voices,
            speaks=talker is not None,
            context_tokens=int(args["max_model_len"]),  # prompts this long get a 400
            media_limits=dict(args.get("limit_mm_per_prompt") or {}),  # more: a 400
            sessions=SessionStoreClient(session_store) if session_store else None,
            replies=SpokenReplyClient(spoken_replies) if spoken_replies else None,
        )
        self.metrics_export = export_stage_metrics("ingress", ingress_stats)
        self.created = int(time.time())

    async def observe_stores(self) -> None:
        await self.chat.observe_stores()

    async def degraded(self) -> dict[str, str]:
        return await self.chat.degraded()

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> Response:
        prompt, options = await self.chat.prepare(body)
        audio_id = new_id("audio")
        expires_at = int(time.time() + self.config.api.spoken_reply_ttl_s)
        if body.stream:
            writer = ChunkWriter(
                new_id("chatcmpl"),
                self.config.served_model_name,
                audio_id,
                SAMPLE_RATE,
                body.audio.format if body.audio else "pcm16",
                include_usage=bool(body.stream_options and body.stream_options.include_usage),
                audio_expires_at=expires_at,
            )
            answer = self.chat.sse(body, prompt, options, uuid.uuid4().hex, writer, audio_id)
            return StreamingResponse(answer, media_type="text/event-stream")
        result = await self.chat.complete(body, prompt, options, audio_id)
        audio = None
        audio_s = 0.0
        if options.want_audio and result.audio is not None:
            audio_s, fmt = len(result.audio) / SAMPLE_RATE, body.audio.format
            data = await asyncio.to_thread(encode_audio, result.audio, SAMPLE_RATE, fmt)
            audio = {
                "id": audio_id,
                "data": base64.b64encode(data).decode(),
                "expires_at": expires_at,
                "transcript": result.text,
            }
        self.metrics.observe_result(result.timings, len(result.token_ids), audio_s)
        self.metrics.requests.labels("ok").inc()
        usage = reply_usage(result)
        response = chat_completion_response(
            self.config.served_model_name, result.text, audio, result.finish_reason, usage
        )
        response["timings"] = result.timings
        return JSONResponse(response)
