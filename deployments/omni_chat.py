"""The omni chat path that every route of its ingress calls: the REST chat and audio
routes, the WebSocket and the Realtime API.

``OmniChat`` checks a request's options, builds its prompt (off the event loop: see
``PromptWorker``), runs it through the stages within the request's deadline, hands a session's
KV prefix from turn to turn, keeps the transcripts of spoken replies, and counts it all in
``/metrics``. The routes only shape requests and answers.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from deployments import handle_calls
from deployments.session_store import SessionStoreClient
from deployments.spoken_reply_store import SpokenReplyClient
from omni_serve.api.deadline import RequestTimeout, await_within, iterate_within, request_deadline
from omni_serve.api.errors import (
    ApiError,
    ContextOverflow,
    StageUnavailable,
    check_model,
    refuse_unsupported,
    stage_failure,
)
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.api.speech import SpeechRequest
from omni_serve.api.sse import DONE, ChunkWriter
from omni_serve.api.transcriptions import TranscriptWriter
from omni_serve.config import PipelineConfig
from omni_serve.media.audio_codec import STREAMABLE_FORMATS
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.media.decode import MediaError
from omni_serve.media.proxy import ProxyUnreachable
from omni_serve.models.thinker_talker.chat_flow import (
    ChatEvent,
    ChatOptions,
    ChatResult,
    StageClients,
    collect,
    stream_chat,
)
from omni_serve.models.thinker_talker.family import SAMPLE_RATE
from omni_serve.models.thinker_talker.prompt_worker import PromptWorker
from omni_serve.models.thinker_talker.request import PreparedPrompt, over_media_limits
from omni_serve.observability.metrics import ApiMetrics
from omni_serve.transport.session_prefixes import free_prefix

log = logging.getLogger("ray.serve")


def outcome(failure: ApiError) -> str:
    """The ``omni_requests`` status label: "unavailable" (503: busy, or a replica died) is
    the client's cue to retry, "error" a failure to look into."""
    return "unavailable" if failure.status == 503 else "error"


class OmniChat:
    """``speaks``: the pipeline has a Talker (else it answers in text and refuses audio);
    ``sessions``: the app's store of sessions' KV prefixes (with the Thinker's ``session_kv``
    edge); ``replies``: its transcripts of spoken replies by audio id; ``context_tokens`` and
    ``media_limits``: the Thinker's, for a 400 instead of an engine error."""

    def __init__(
        self,
        config: PipelineConfig,
        prompts: PromptWorker,
        clients: StageClients,
        metrics: ApiMetrics,
        *,
        voices: set[str],
        speaks: bool,
        context_tokens: int,
        media_limits: dict[str, Any],
        sessions: SessionStoreClient | None = None,
        replies: SpokenReplyClient | None = None,
    ) -> None:
        self.config, self.prompts, self.clients, self.metrics = config, prompts, clients, metrics
        # This replica's chats running now that make speech, by every way in: the Talker and
        # Code2wav load that slows each answer's first audio (a text-only chat barely does).
        self.speaking_in_flight = 0
        self.voices, self.speaks = voices, speaks
        self.context_tokens, self.media_limits = context_tokens, media_limits
        self.sessions, self.replies = sessions, replies

    async def prepare(
        self, body: ChatCompletionRequest, reply_room: int = 1
    ) -> tuple[PreparedPrompt, ChatOptions]:
        """The request's options checked, then its prompt built, so a request with bad
        options is refused before its media decode. ``reply_room``: the tokens of context the
        prompt must leave free (the answer's budget, where the caller would rather shorten
        the prompt than have the answer cut at the context's end)."""
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
            self.check_speaks("modalities")
        if want_audio and body.audio is None:
            raise ApiError(400, "modalities includes 'audio': give audio {voice, format}", "audio")
        voice = body.audio.voice if body.audio else "ethan"
        if want_audio:
            self.check_voice(voice, "audio.voice")
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
        if n_prompt + reply_room > self.context_tokens:
            raise ContextOverflow(n_prompt, self.context_tokens, reply_room)
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
        named = [(i, m.reply_by_id) for i, m in enumerate(messages) if m.reply_by_id is not None]
        if not named:
            return messages
        if self.replies is None:
            i, audio_id = named[0]
            why = "this deployment makes no spoken replies"
            if self.speaks:
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

    async def events(
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
            options.session_kv = await self.sessions.find(options.session_id, prompt.content)
        done = False
        self.speaking_in_flight += options.want_audio
        try:
            chat = stream_chat(self.clients, prompt, options, request_id)
            async with contextlib.aclosing(chat):  # a cancel stops the stages at once
                async for event in chat:
                    if event.kind == "done":
                        done = True
                        if self.sessions is not None:
                            kv = event.result.session_kv
                            await self.sessions.keep(options.session_id, kv, prompt.content)
                        else:  # nothing exports without the edge; nobody would load it
                            free_prefix(event.result.session_kv)
                        self.metrics.observe_prompt(
                            event.result.prompt_tokens, event.result.cached_tokens
                        )
                        if audio_id and self.replies and event.result.audio is not None:
                            await self.replies.keep(audio_id, event.result.text)
                    yield event
        finally:
            self.speaking_in_flight -= options.want_audio
            if not done:  # failed or cancelled: free it unless the Thinker loaded it already
                free_prefix(options.session_kv)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """A request being served, for ``omni_requests_in_flight``."""
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self.metrics.in_flight.dec()

    def deadline(self, body: ChatCompletionRequest | SpeechRequest) -> float | None:
        return request_deadline(body.timeout_s, self.config.api.request_timeout_s)

    async def complete(
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
                    lambda: collect(self.events(prompt, options, request_id, audio_id))
                ),
                self.deadline(body),
            )
        except RequestTimeout as exc:
            self.metrics.requests.labels("timeout").inc()
            raise ApiError(504, str(exc), "timeout_s", type_="timeout_error") from None
        except Exception as exc:  # a stage failed: say so, in the API's error shape
            log.exception("chat request failed in a stage")
            failure = stage_failure(exc)
            self.metrics.requests.labels(outcome(failure)).inc()
            raise failure from None
        finally:
            self.metrics.in_flight.dec()

    async def sse(
        self,
        body: ChatCompletionRequest,
        prompt: PreparedPrompt,
        options: ChatOptions,
        request_id: str,
        writer: ChunkWriter | TranscriptWriter,
        audio_id: str | None = None,
    ) -> AsyncIterator[str]:
        """A chat streamed as server-sent events ``writer`` shapes (``omni_serve.api.sse``):
        past the deadline or on a stage failure the headers are out, so an error event ends
        the stream. A client that leaves closes this generator at a ``yield``: its chat counts
        as cancelled, as the other streamed ways in count theirs."""
        self.metrics.in_flight.inc()
        status = "cancelled"
        try:
            for line in writer.start():
                yield line
            events = self.events(prompt, options, request_id, audio_id)
            stream = iterate_within(events, self.deadline(body))
            async with contextlib.aclosing(stream):  # a client gone stops the stages at once
                async for event in stream:
                    if event.kind == "done":
                        self._observe_result(event.result)
                    for line in writer.event(event):
                        yield line
            status = "ok"
        except RequestTimeout as exc:
            status = "timeout"
            yield writer.error(str(exc), "timeout_error")
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            log.exception("streamed chat request failed in a stage")
            failure = stage_failure(exc)
            status = outcome(failure)
            yield writer.error(failure.message, failure.type)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(status).inc()
        yield DONE

    async def observed(
        self, events: AsyncIterator[ChatEvent], prepare_s: float
    ) -> AsyncIterator[ChatEvent]:
        """A streamed answer counted in /metrics as a chat is: in flight while it runs, then
        its outcome and timings (with ``prepare_s``: building its prompt, before the stages)."""
        self.metrics.in_flight.inc()
        status = "cancelled"
        try:
            async with contextlib.aclosing(events):  # closed with this stream, not collected
                async for event in events:
                    if event.kind == "done":
                        status = "ok"
                        event.result.timings["prepare_s"] = prepare_s
                        self._observe_result(event.result)
                    yield event
        except Exception:
            status = "error"
            raise
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(status).inc()

    def _observe_result(self, result: ChatResult) -> None:
        audio_s = len(result.audio) / SAMPLE_RATE if result.audio is not None else 0.0
        self.metrics.observe_result(result.timings, len(result.token_ids), audio_s)

    async def speech_events(
        self, body: SpeechRequest, deadline: bool = True
    ) -> AsyncIterator[ChatEvent]:
        """Text to speech as a chat: the Thinker prefills the text (for its rows) and the
        Talker speaks it as the reply. Within its deadline it is counted in /metrics as a
        chat is; the caller of ``deadline=False`` (a whole reply, rerun after a replica
        death) counts it itself."""
        start = time.perf_counter()
        prompt, reply = await self.prompts.speech(body.input)
        sampling = {"max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "seed": None}
        options = ChatOptions(
            sampling,
            True,
            body.voice,
            body.talker_sampling(body.seed),
            reply_ids=reply,
            session_id=body.session_id,
        )
        events = self.events(prompt, options, uuid.uuid4().hex)
        if not deadline:
            return events
        within = iterate_within(events, self.deadline(body))
        return self.observed(within, time.perf_counter() - start)

    def check_speech(self, body: SpeechRequest, param: str) -> None:
        """A speech request's checks, before anything runs; ``param`` names the field that
        asked for speech on a text-only deployment."""
        check_model(body.model, self.config.served_model_name)
        self.check_speaks(param)
        refuse_unsupported(body)
        self.check_voice(body.voice, "voice")

    def check_voice(self, voice: str, param: str) -> None:
        if voice.lower() not in self.voices:
            raise ApiError(400, f"unknown voice {voice!r}; voices: {sorted(self.voices)}", param)

    def check_speaks(self, param: str) -> None:
        if not self.speaks:
            message = "this deployment answers in text only: its pipeline has no talker stage"
            raise ApiError(400, message, param)

    async def degraded(self) -> dict[str, str]:
        """The KV store's disk tier, when it cannot write (its turns lose reuse, nothing else)."""
        kept = await self.sessions.stats() if self.sessions is not None else None
        reason = kept.get("degraded") if kept else None
        return {"kv_store.disk": reason} if reason else {}

    async def observe_stores(self) -> None:
        """The session and spoken-reply stores' sizes, for /metrics."""
        if self.sessions is not None:
            kept = await self.sessions.stats()
            if kept is not None:
                self.metrics.observe_kv_store(kept)
        if self.replies is not None:
            kept = await self.replies.stats()
            self.metrics.spoken_replies.labels("replies").set(kept["replies"])
            self.metrics.spoken_replies.labels("bytes").set(kept["bytes"])
