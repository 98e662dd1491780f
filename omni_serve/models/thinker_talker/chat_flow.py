"""One chat request of a Thinker-Talker family across the stages: Thinker → (Talker → codec).

Streaming is the path: ``stream_chat`` yields text deltas as the Thinker makes them and audio
chunks as Code2wav decodes them (a small first chunk of codec frames, then steady chunks);
``collect`` gathers it for non-streaming responses. Stage access is abstract
(``StageClients``) so the flow runs the same over Serve handles and over in-process engines.
Heavy tensors (the Thinker's prompt rows) travel as opaque references the Talker resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob
from omni_serve.models.thinker_talker.chunk_decodes import ChunkDecodes
from omni_serve.models.thinker_talker.family import SAMPLE_RATE
from omni_serve.models.thinker_talker.media_payload import media_payload
from omni_serve.models.thinker_talker.messages import (
    CodecFrame,
    ShippedMedia,
    SpeakEvent,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
)
from omni_serve.models.thinker_talker.request import PreparedPrompt


class StageClients(Protocol):
    def thinker(self, request: ThinkerRequest) -> AsyncIterator[ThinkerChunk]:
        """The Thinker's chunks (text replies)."""

    def speak(self, request: SpeakRequest) -> AsyncIterator[SpeakEvent]:
        """The Thinker's chunks and the Talker's codec frames of one spoken reply, the Talker
        following the Thinker token by token."""

    async def code2wav(self, jobs: list[DecodeJob]) -> list[np.ndarray]: ...

    async def codec_info(self) -> CodecInfo:
        """The codec's frame size and left context, and its streaming chunk plan."""

    async def encode_audio(self, clips: list[np.ndarray]) -> Any | None:
        """A channel ref to the audio tower's rows for these clips (16 kHz float32 samples),
        or None without an encoder stage (the Thinker then encodes the media itself)."""

    async def encode_images(self, images: list[Any]) -> Any | None:
        """A channel ref to the vision tower's rows of these (RGB PIL) images (deepstack
        features concatenated on the last dim), or None without an encoder stage."""

    async def encode_videos(self, videos: list[Any]) -> Any | None:
        """As ``encode_images``, for videos given as frames (uint8 [T, H, W, 3] each)."""

    def put(self, payload: dict[str, torch.Tensor]) -> Any:
        """A channel ref to ``payload`` for a stage to take (the caller of the call that
        carries it frees it if the stage never reads it)."""

    def release(self, *refs: Any) -> None:
        """Frees refs no call will carry (what the encoder made for a request that failed)."""


@dataclass
class ChatResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, served from a KV prefix (not computed)
    session_kv: str | None = None  # this turn's exported KV prefix (encoded), for the next turn
    audio: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class ChatEvent:
    kind: Literal["text", "audio", "done"]
    text: str = ""
    audio: np.ndarray | None = None
    result: ChatResult | None = None


@dataclass
class ChatOptions:
    """``reply_ids``: speak these tokens as the reply instead of generating one (TTS)."""

    sampling: dict[str, Any]
    want_audio: bool = False
    voice: str = "ethan"
    talker_sampling: dict[str, Any] = field(default_factory=dict)
    reply_ids: list[int] | None = None
    session_id: str | None = None  # routing affinity (omni_serve.routing.policy)
    cache_key: str | None = None  # routing affinity, without a session's KV handover
    session_kv: str | None = None  # the session's last exported KV prefix, for the Thinker


def _listed(small: torch.Tensor | None) -> list | None:
    """A request's small tensors (grids, lengths) as lists: they ride stage calls, and a torch
    tensor takes ~100 us to pickle and load, a short list a few."""
    return None if small is None else small.tolist()


def _finished_results(futures: Any) -> list[Any]:
    """The results of the futures that finished with one (not None, not failed, not
    cancelled)."""
    return [
        f.result()
        for f in futures
        if f.done() and not f.cancelled() and f.exception() is None and f.result() is not None
    ]


async def _encode_vision(clients: StageClients, prompt: PreparedPrompt) -> dict[str, Any]:
    """The ``ThinkerRequest`` fields for the prompt's images and videos encoded by the encoder
    stage (both kinds at once), or nothing without an encoder stage."""
    calls: dict[str, asyncio.Future] = {}
    for kind in ("image", "video"):
        if prompt.counts.get(kind):
            items = prompt.multi_modal_data[kind]
            items = items if isinstance(items, list) else [items]
            encode = clients.encode_images if kind == "image" else clients.encode_videos
            calls[kind] = asyncio.ensure_future(encode(items))
    try:
        results = await asyncio.gather(*calls.values(), return_exceptions=True)
    except asyncio.CancelledError:
        # The request is gone (client left, deadline): gather has cancelled the encode still
        # running, and rows one already made have no call to carry them.
        clients.release(*_finished_results(calls.values()))
        raise
    made = [r for r in results if r is not None and not isinstance(r, BaseException)]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None or len(made) < len(results):
        clients.release(*made)
        if failure is not None:
            raise failure
        return {}
    rows = dict(zip(calls, results, strict=True))
    fields: dict[str, Any] = {}
    if "image" in rows:
        fields.update(image_rows=rows["image"], image_grid_thw=_listed(prompt.image_grid_thw))
    if "video" in rows:
        fields.update(
            video_rows=rows["video"],
            video_grid_thw=_listed(prompt.video_grid_thw),
            video_second_per_grid=prompt.video_second_per_grid,
        )
    return fields


async def stream_chat(
    clients: StageClients, prompt: PreparedPrompt, options: ChatOptions, request_id: str
) -> AsyncIterator[ChatEvent]:
    start = time.perf_counter()
    # First, before any channel ref exists: refs are freed when the call carrying them ends,
    # and a failure between making one and starting that call would strand it.
    info = await clients.codec_info() if options.want_audio else None
    thinker_request = ThinkerRequest(
        request_id,
        prompt.prompt_ids,
        SamplingConfig(**options.sampling),
        capture=options.want_audio,
        session_id=options.session_id,
        session_kv=options.session_kv,
        cache_key=options.cache_key,
        mm_processor_kwargs=prompt.mm_processor_kwargs or None,
    )
    expanded_ids = prompt.prompt_ids  # media placeholders expanded by the Thinker's processor
    timings: dict[str, float] = {}
    raw_media = prompt.multi_modal_data  # what the Thinker encodes itself
    vision = prompt.counts.get("image") or prompt.counts.get("video")
    if vision and not prompt.counts.get("audio"):
        # Images and videos by the encoder stage. Prompts with audio AND images or videos
        # stay with the Thinker: vLLM 0.32 cannot mix raw audio with vision embeddings in one
        # request, and an embeddings prompt (how encoded audio goes in) cannot carry them.
        encoded = await _encode_vision(clients, prompt)
        if encoded:
            raw_media = {}
            thinker_request = dataclasses.replace(
                thinker_request, **encoded, mm_processor_kwargs=None
            )  # the kwargs are for vLLM's own video processing
            timings["encoder_s"] = time.perf_counter() - start
    elif prompt.audio_clips:
        audio_rows = await clients.encode_audio(prompt.audio_clips)
        if audio_rows is not None:
            raw_media = {}
            thinker_request.prompt_ids, thinker_request.audio_rows = prompt.expanded_ids, audio_rows
            expanded_ids = prompt.expanded_ids
            timings["encoder_s"] = time.perf_counter() - start
    if raw_media:  # on the channel, never as call arguments (media_payload.py)
        tensors, layout = media_payload(raw_media)
        thinker_request.media = ShippedMedia(clients.put(tensors), layout)
    text, tokens, reason, n_cached, session_kv = [], [], "stop", 0, None
    n_prompt = len(expanded_ids)
    first_audio = True
    events: AsyncIterator[SpeakEvent]
    if options.want_audio:
        events = clients.speak(
            SpeakRequest(
                request_id,
                thinker_request,
                expanded_ids,
                options.voice,
                options.talker_sampling,
                image_grid_thw=_listed(prompt.image_grid_thw),
                video_grid_thw=_listed(prompt.video_grid_thw),
                video_second_per_grid=prompt.video_second_per_grid,
                audio_seqlens=_listed(prompt.audio_seqlens),
                reply_ids=options.reply_ids,
            )
        )
        planner = info.planner(uuid.uuid4().hex, options.voice)  # new per attempt
    else:
        events = clients.thinker(thinker_request)
    audio: list[np.ndarray] = []
    # A text reply decodes nothing (its clients need no codec).
    decodes = ChunkDecodes(clients.code2wav, info.chunks_in_flight) if info else ChunkDecodes.NONE
    # Closed with this stream (a cancel, a client that left), not when collected: closing
    # it is what stops the Thinker and the Talker behind it, and the decodes in flight.
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                if isinstance(event, CodecFrame):
                    timings.setdefault("first_frame_s", time.perf_counter() - start)
                    # The last code read: none is read while a decode holds the flow.
                    timings["last_frame_s"] = time.perf_counter() - start
                    jobs = planner.push(torch.tensor(event.codes)[:, None])
                    pieces = await (decodes.submit(jobs) if jobs else decodes.ready())
                else:
                    tokens += event.token_ids
                    if event.token_ids:
                        timings.setdefault("first_token_s", time.perf_counter() - start)
                    if event.text:
                        text.append(event.text)
                        yield ChatEvent("text", text=event.text)
                    if event.finished:
                        reason = event.finish_reason or "stop"
                        n_prompt = event.num_prompt_tokens or n_prompt
                        n_cached = event.num_cached_tokens
                        session_kv = event.session_kv
                        timings["thinker_s"] = time.perf_counter() - start
                    pieces = await decodes.ready()
                for piece in pieces:
                    if first_audio:
                        timings["first_audio_s"] = time.perf_counter() - start
                        first_audio = False
                    audio.append(piece)
                    yield ChatEvent("audio", audio=piece)
            if options.want_audio:
                last = planner.finish()
                if last is not None:
                    decodes.start([last])
                async for piece in decodes.drain():
                    timings.setdefault("first_audio_s", time.perf_counter() - start)
                    audio.append(piece)
                    yield ChatEvent("audio", audio=piece)
        finally:
            await decodes.aclose()
    result = ChatResult(
        "".join(text), tokens, reason, n_prompt, n_cached, session_kv, timings=timings
    )
    if options.want_audio:
        result.audio = np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)
    result.timings["total_s"] = time.perf_counter() - start
    if result.audio is not None and len(result.audio):
        # Real-time factor: < 1 means audio is produced faster than it plays.
        result.timings["rtf"] = result.timings["total_s"] / (len(result.audio) / SAMPLE_RATE)
    yield ChatEvent("done", result=result)


async def collect(events: AsyncIterator[ChatEvent]) -> ChatResult:
    """A chat's events, collected: its result."""
    async for event in events:
        if event.kind == "done":
            return event.result
    raise RuntimeError("chat stream ended without a result")
