"""The Qwen3-Omni ingress: the OpenAI-compatible HTTP API, orchestrating the stage deployments."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments import handle_calls
from deployments.audio_routes import AudioRoutes
from deployments.common import (
    ReleasesSharedMemory,
    configure_http_guards,
    edge_channel,
    export_stage_metrics,
    in_serve_replica,
    ingress_stats,
    serve_problems,
)
from deployments.omni_api import app
from deployments.omni_stage_clients import HandleStageClients
from deployments.realtime_routes import RealtimeRoutes
from deployments.session_store import SessionStoreClient
from deployments.spoken_reply_store import SpokenReplyClient
from omni_serve.api import playground
from omni_serve.api.deadline import RequestTimeout, await_within, iterate_within, request_deadline
from omni_serve.api.errors import (
    ApiError,
    StageUnavailable,
    check_model,
    refuse_unsupported,
    stage_failure,
)
from omni_serve.api.protocol import (
    ChatCompletionRequest,
    chat_completion_response,
    model_card,
    model_list,
    new_id,
    reply_usage,
)
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.sse import DONE, ChunkWriter
from omni_serve.config import PipelineConfig
from omni_serve.engines.ar.vllm_engine import DEFAULT_ENGINE_ARGS
from omni_serve.media.audio_codec import STREAMABLE_FORMATS, encode_audio
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.media.decode import MediaError
from omni_serve.media.proxy import ProxyUnreachable
from omni_serve.models import resolve_model
from omni_serve.models.qwen3_omni.chat_flow import (
    ChatEvent,
    ChatOptions,
    ChatResult,
    collect,
    stream_chat,
)
from omni_serve.models.qwen3_omni.codec import SAMPLE_RATE
from omni_serve.models.qwen3_omni.prompt_worker import PromptWorker
from omni_serve.models.qwen3_omni.request import PreparedPrompt, over_media_limits
from omni_serve.observability.health import stage_health
from omni_serve.observability.metrics import ApiMetrics
from omni_serve.transport.session_prefixes import free_prefix

log = logging.getLogger("ray.serve")


def _outcome(failure: ApiError) -> str:
    """The ``omni_requests`` status label: "unavailable" (503: busy, or a replica died) is
    the client's cue to retry, "error" a failure to look into."""
    return "unavailable" if failure.status == 503 else "error"


# Keep module-level helpers ABOVE this class: Serve pickles the class by value when the
# decorator runs, so a global defined below it is missing in the replica (NameError).
@serve.deployment
@serve.ingress(app)
class OmniIngress(AudioRoutes, RealtimeRoutes, ReleasesSharedMemory):
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

        from omni_serve.models.qwen3_omni.checkpoint import load_config

        self.config = PipelineConfig.model_validate(pipeline)
        configure_http_guards(self.config)
        model_path = resolve_model(self.config.model)
        self.prompts = PromptWorker(AutoProcessor.from_pretrained(model_path), self.config.api)
        # Without a Talker (a text-only pipeline: the Thinking and Captioner checkpoints have
        # none) the app answers in text and refuses audio output.
        self.voices = set(load_config(model_path).talker_config.speaker_id) if talker else set()
        playground.configure(
            self.config.api.playground, "speech", self.config.served_model_name, sorted(self.voices)
        )
        self.handles = {"thinker": thinker}
        for name, handle in (("talker", talker), ("code2wav", code2wav), ("encoder", encoder)):
            if handle is not None:
                self.handles[name] = handle
        self.clients = HandleStageClients(
            self.handles,
            edge_channel(self.config, "ingress", "media", target="encoder"),
            edge_channel(self.config, "ingress", "media", target="thinker"),
        )
        # With the Thinker's session_kv edge: the app's store of sessions' prefixes.
        self.sessions = SessionStoreClient(session_store) if session_store else None
        # With a Talker: the app's transcripts of spoken replies, by audio id.
        self.replies = SpokenReplyClient(spoken_replies) if spoken_replies else None
        thinker = self.config.stage("thinker").engine
        args = {**DEFAULT_ENGINE_ARGS, **(thinker.args if thinker else {})}
        self.context_tokens = int(args["max_model_len"])  # prompts this long get a 400
        self.media_limits = dict(args.get("limit_mm_per_prompt") or {})  # more: a 400
        self.metrics = ApiMetrics(to_ray=in_serve_replica())
        self.metrics_export = export_stage_metrics("ingress", ingress_stats)
        self.created = int(time.time())

    async def _chat(
        self,
        prompt: PreparedPrompt,
        options: ChatOptions,
        request_id: str,
        audio_id: str | None = None,
    ) -> AsyncIterator[ChatEvent]:
        """One chat through the stages; a session's turn takes the KV prefix its previous turn
        exported (for whichever Thinker replica it lands on) and leaves its own for the next.
        A spoken reply's transcript is kept under ``audio_id`` for a later turn to name."""
        if self.sessions is not None:
            options.session_kv = await self.sessions.pop(options.session_id)
        done = False
        try:
            async for event in stream_chat(self.clients, prompt, options, request_id):
                if event.kind == "done":
                    done = True
                    if self.sessions is not None:
                        await self.sessions.keep(options.session_id, event.result.session_kv)
                    else:  # nothing exports without the edge; nobody would load it
                        free_prefix(event.result.session_kv)
                    self.metrics.observe_prompt(
                        event.result.prompt_tokens, event.result.cached_tokens
                    )
                    if audio_id and self.replies and event.result.audio is not None:
                        await self.replies.keep(audio_id, event.result.text)
                yield event
        finally:
            if not done:  # failed or cancelled: free it unless the Thinker loaded it already
                free_prefix(options.session_kv)

    @app.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        return model_list(self.config.served_model_name, self.created)

    @app.get("/v1/models/{model_id:path}")  # an id may hold a slash (org/name)
    async def model(self, model_id: str) -> dict[str, Any]:
        check_model(model_id, self.config.served_model_name)
        return model_card(model_id, self.created)

    @app.get("/health")
    async def health(self) -> JSONResponse:
        return await stage_health(self.handles, explain=serve_problems)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        stages = ("encoder", "thinker", "talker", "code2wav")
        await self.metrics.poll_stages({n: h for n, h in self.handles.items() if n in stages})
        self.metrics.observe_channel("ingress", ingress_stats())
        if self.sessions is not None:
            kept = await self.sessions.stats()
            self.metrics.session_kv.labels("prefixes").set(kept["prefixes"])
            self.metrics.session_kv.labels("bytes").set(kept["bytes"])
        if self.replies is not None:
            kept = await self.replies.stats()
            self.metrics.spoken_replies.labels("replies").set(kept["replies"])
            self.metrics.spoken_replies.labels("bytes").set(kept["bytes"])
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> Response:
        prompt, options = await self._prepare(body)
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
            answer = self._sse(body, prompt, options, uuid.uuid4().hex, writer, audio_id)
            return StreamingResponse(answer, media_type="text/event-stream")
        result = await self._complete(body, prompt, options, audio_id)
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

    def _deadline(self, body: ChatCompletionRequest | SpeechRequest) -> float | None:
        return request_deadline(body.timeout_s, self.config.api.request_timeout_s)

    async def _prepare(self, body: ChatCompletionRequest) -> tuple[PreparedPrompt, ChatOptions]:
        """The request's options checked, then its prompt built (off the event loop: see
        ``PromptWorker``), so a request with bad options is refused before its media decode."""
        api = self.config.api
        check_model(body.model, self.config.served_model_name)
        refuse_unsupported(body)
        max_tokens = body.max_completion_tokens or body.max_tokens or api.default_max_tokens
        if max_tokens > api.max_tokens_limit:
            raise ApiError(400, f"max_tokens must be <= {api.max_tokens_limit}", "max_tokens")
        if body.min_tokens > max_tokens:
            message = f"min_tokens ({body.min_tokens}) is over max_tokens ({max_tokens})"
            raise ApiError(400, message, "min_tokens")
        if "image" in body.modalities:
            raise ApiError(
                400, "modalities: this model answers in text and audio, not images", "modalities"
            )
        want_audio = "audio" in body.modalities
        if want_audio:
            self._check_speaks("modalities")
        if want_audio and body.audio is None:
            raise ApiError(400, "modalities includes 'audio': give audio {voice, format}", "audio")
        voice = body.audio.voice if body.audio else "ethan"
        if want_audio:
            self._check_voice(voice, "audio.voice")
        if want_audio and body.stream and body.audio.format not in STREAMABLE_FORMATS:
            message = f"streamed audio must be one of {list(STREAMABLE_FORMATS)}"
            raise ApiError(400, message, "audio.format")
        hear_video = body.hears_video_audio
        messages = await self._recall_replies(body.messages)
        too_many = over_media_limits(messages, self.media_limits, hear_video)
        if too_many:
            raise ApiError(400, too_many, "messages")
        try:
            prompt = await self.prompts.chat(messages, hear_video)
        except MediaError as exc:
            raise ApiError(400, str(exc), exc.param) from None
        except ProxyUnreachable as exc:
            raise ApiError(502, str(exc), type_="server_error", code="media_proxy") from None
        n_prompt = len(prompt.expanded_ids or prompt.prompt_ids)
        if n_prompt >= self.context_tokens:
            message = (
                f"the prompt is {n_prompt} tokens; this model's context is "
                f"{self.context_tokens} tokens, prompt and reply together"
            )
            raise ApiError(400, message, "messages")
        sampling = {
            "max_tokens": max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "seed": body.seed,
            "stop": body.stop,
            "presence_penalty": body.presence_penalty,
            "frequency_penalty": body.frequency_penalty,
            "repetition_penalty": body.repetition_penalty,
            "min_p": body.min_p,
            "min_tokens": body.min_tokens,
            "ignore_eos": body.ignore_eos,
            "logit_bias": body.token_biases,
        }
        options = ChatOptions(
            sampling,
            want_audio,
            voice,
            body.talker_sampling(body.seed),
            session_id=body.session_id,
            cache_key=body.prompt_cache_key,
        )
        return prompt, options

    async def _recall_replies(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """The messages, each earlier spoken reply named only by its audio id given the
        transcript kept under that id (the model hears its earlier turns as text)."""
        named = [(i, m.reply_by_id) for i, m in enumerate(messages) if m.reply_by_id]
        if not named:
            return messages
        if self.replies is None:
            i, audio_id = named[0]
            why = "this deployment makes no spoken replies"
            if "talker" in self.handles:
                why = "this server keeps none (api.spoken_reply_ttl_s is 0)"
            message = f"no spoken reply {audio_id!r} to recall: {why}; send its transcript"
            raise ApiError(400, message, f"messages[{i}].audio.id")
        transcripts = await self.replies.transcripts([audio_id for _, audio_id in named])
        if transcripts is None:
            raise stage_failure(StageUnavailable("the store of spoken replies did not answer", 5))
        recalled = list(messages)
        for (i, audio_id), transcript in zip(named, transcripts, strict=True):
            if transcript is None:
                message = (
                    f"no spoken reply {audio_id!r} is kept: unknown, or past its "
                    "expires_at; send its transcript as content"
                )
                raise ApiError(400, message, f"messages[{i}].audio.id")
            recalled[i] = messages[i].model_copy(update={"content": transcript})
        return recalled

    async def _complete(
        self,
        body: ChatCompletionRequest,
        prompt: PreparedPrompt,
        options: ChatOptions,
        audio_id: str | None = None,
    ) -> ChatResult:
        """A chat run whole (again from the start if a replica died before it answered),
        within its deadline; a failure is the API's error (504, 503, 400, 500)."""
        request_id = uuid.uuid4().hex
        self.metrics.in_flight.inc()
        try:
            return await await_within(
                handle_calls.rerun_after_replica_death(
                    lambda: collect(self._chat(prompt, options, request_id, audio_id))
                ),
                self._deadline(body),
            )
        except RequestTimeout as exc:
            self.metrics.requests.labels("timeout").inc()
            raise ApiError(504, str(exc), "timeout_s", type_="timeout_error") from None
        except Exception as exc:  # a stage failed: say so, in the API's error shape
            log.exception("chat request failed in a stage")
            failure = stage_failure(exc)
            self.metrics.requests.labels(_outcome(failure)).inc()
            raise failure from None
        finally:
            self.metrics.in_flight.dec()

    async def _sse(
        self, body, prompt, options, request_id, writer, audio_id: str | None = None
    ) -> AsyncIterator[str]:
        """A chat streamed as server-sent events ``writer`` shapes (``omni_serve.api.sse``):
        past the deadline or on a stage failure the headers are out, so an error event ends
        the stream."""
        self.metrics.in_flight.inc()
        try:
            for line in writer.start():
                yield line
            events = self._chat(prompt, options, request_id, audio_id)
            async for event in iterate_within(events, self._deadline(body)):
                if event.kind == "done":
                    result = event.result
                    audio_s = len(result.audio) / SAMPLE_RATE if result.audio is not None else 0
                    self.metrics.observe_result(result.timings, len(result.token_ids), audio_s)
                for line in writer.event(event):
                    yield line
            self.metrics.requests.labels("ok").inc()
        except RequestTimeout as exc:
            self.metrics.requests.labels("timeout").inc()
            yield writer.error(str(exc), "timeout_error")
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            log.exception("streamed chat request failed in a stage")
            failure = stage_failure(exc)
            self.metrics.requests.labels(_outcome(failure)).inc()
            yield writer.error(failure.message, failure.type)
        finally:
            self.metrics.in_flight.dec()
        yield DONE
