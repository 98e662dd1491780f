"""One client connection of the audio WebSocket: requests one at a time, a voice streamed in,
an answer that can be cut short, and no idle client holding a slot forever.

- A reader task takes every message as it arrives, also while an answer streams: binary
  frames (PCM16 mono, the client's microphone) go into the connection's audio buffer, a chat
  with ``input_audio`` takes the buffer as its clip at that moment (so frames sent after it
  belong to the next one; a chat whose ``input_audio`` is refused takes nothing, so the client
  can send it again fixed without sending its voice again), ``response.cancel`` stops the
  answer running in every stage (so does the client leaving) and other requests wait their
  turn.
- Sends go through one lock, and an audio event and its binary frame go together even when
  the answer is cancelled between them: the client reads a frame after each audio event.
- An open WebSocket holds one of the ingress replica's ``max_ongoing_requests`` slots for as
  long as it lives, so a client that sends nothing for ``idle_timeout_s`` (counted from its
  last message or the end of its last answer) is told so and disconnected.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Coroutine
from typing import Any, NoReturn

import numpy as np
import soundfile as sf
from fastapi import WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from omni_serve.api.deadline import RequestTimeout
from omni_serve.api.errors import ApiError, stage_failure
from omni_serve.api.protocol import error_body

IDLE_CLOSE_CODE = 1000  # a normal close: the server ended an idle session
MAX_WAITING_REQUESTS = 8  # requests a client may queue behind the answer running
_CLOSED = object()


class IdleTimeout(Exception):
    pass


def error_event(exc: Exception) -> dict[str, Any]:
    """A request's failure as the error event the socket stays open after: the HTTP routes'
    error body, with the status left out."""
    if isinstance(exc, ApiError):
        return {"type": "error", **exc.body}
    if isinstance(exc, RequestTimeout):
        return {"type": "error", **error_body(str(exc), "timeout_error")}
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return {"type": "error", **error_body(f"{where}: {first['msg']}", param=where)}
    if isinstance(exc, ValueError | KeyError | TypeError):  # incl. JSON decode errors
        return {"type": "error", **error_body(str(exc)[:500])}
    return {"type": "error", **stage_failure(exc).body}


class InputAudio(BaseModel):
    """A chat's ``input_audio``: take the frames sent since the last clip as a user message."""

    model_config = ConfigDict(extra="forbid")
    sample_rate: int = Field(16000, ge=8000, le=48000, description="The frames' sample rate.")


def clip_message(input_audio: Any, pcm: bytes, max_seconds: float) -> dict[str, Any]:
    """The user message the buffered frames become: PCM16 mono as a WAV ``input_audio`` part,
    so the clip is resampled and encoded as any clip a chat sends."""
    try:
        spec = InputAudio.model_validate(input_audio if input_audio is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(["input_audio", *(str(p) for p in first["loc"])])
        raise ApiError(400, f"{where}: {first['msg']}", where) from None
    if not pcm:
        message = ("no audio was sent since the last clip (send it as binary frames of PCM16 "
                   "mono samples before the chat)")  # fmt: skip
        raise ApiError(400, f"input_audio: {message}", "input_audio")
    seconds = len(pcm) / 2 / spec.sample_rate
    if seconds > max_seconds:
        message = f"{seconds:.1f} s of audio is over max_audio_seconds ({max_seconds:g})"
        raise ApiError(400, f"input_audio: {message}", "input_audio")
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm, "<i2"), spec.sample_rate, format="WAV", subtype="PCM_16")
    data = base64.b64encode(wav.getvalue()).decode()
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    return {"role": "user", "content": [part]}


def _refuse(message: str) -> NoReturn:
    raise ApiError(400, message)


class VoiceSocket:
    def __init__(
        self,
        ws: WebSocket,
        idle_timeout_s: float | None,
        max_audio_bytes: int,
        max_audio_seconds: float = float("inf"),
    ) -> None:
        self.ws, self.idle_timeout_s, self.max_audio_bytes = ws, idle_timeout_s, max_audio_bytes
        self.max_audio_seconds = max_audio_seconds
        self.audio = bytearray()  # PCM16 frames not yet taken by a chat
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        self._answering: asyncio.Task | None = None
        self._done = False  # whether the answer running has sent its response.done
        self._gone = False  # whether the client has left
        self._last_heard = time.monotonic()
        self._reader = asyncio.create_task(self._read())

    async def next_request(self) -> tuple[Any, dict[str, Any] | None]:
        """The next request (parsed JSON), with the user message the clip it took from the
        audio buffer became (``clip_message``; ``None`` unless it asked for ``input_audio``).
        Raises ``WebSocketDisconnect`` once the client left, ``IdleTimeout`` (after telling it
        why and closing) when it fell silent."""
        while True:
            timeout = None
            if self.idle_timeout_s is not None:
                timeout = self.idle_timeout_s - (time.monotonic() - self._last_heard)
            try:
                if timeout is not None and timeout <= 0:
                    raise TimeoutError
                item = await asyncio.wait_for(self._requests.get(), timeout)
            except TimeoutError:
                if self.idle_timeout_s - (time.monotonic() - self._last_heard) > 0:
                    continue  # a frame arrived meanwhile
                await self._close_idle()
                raise IdleTimeout from None
            if item is _CLOSED:
                raise WebSocketDisconnect(1000)
            return item

    async def answer(self, response_id: str, streaming: Coroutine[Any, Any, None]) -> None:
        """Runs ``streaming`` (which sends the answer), cut short by the client's
        ``response.cancel``: then ``response.done`` says ``cancelled``."""
        self._done = False
        self._answering = task = asyncio.create_task(streaming)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # the connection's handler itself: stop the answer too
            task.cancel()
            raise
        finally:
            self._answering = None
            self._last_heard = time.monotonic()  # the idle clock starts after the answer
        if not task.cancelled():
            task.result()  # re-raises a disconnect
        elif self._gone:
            raise WebSocketDisconnect(1000)
        elif not self._done:  # (a cancel that came as the answer ended changes nothing)
            await self.send({"type": "response.done", "id": response_id, "status": "cancelled"})

    async def send(self, event: dict[str, Any], frame: bytes | None = None) -> None:
        """One event, and the binary frame that goes with it, never split by a cancel."""
        self._done = self._done or event.get("type") == "response.done"
        await asyncio.shield(self._send(event, frame))

    async def _send(self, event: dict[str, Any], frame: bytes | None) -> None:
        async with self._send_lock:
            await self.ws.send_json(event)
            if frame is not None:
                await self.ws.send_bytes(frame)

    async def close(self) -> None:
        for task in (self._reader, self._answering):
            if task is not None:
                task.cancel()

    async def _read(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                self._last_heard = time.monotonic()
                try:
                    self._take(message)
                except ApiError as refused:
                    await self.send(error_event(refused))
        except (WebSocketDisconnect, RuntimeError):  # gone, or closed by the server
            return
        finally:  # nobody is listening: stop the answer's work in every stage
            self._gone = True
            if self._answering is not None:
                self._answering.cancel()
            self._requests.put_nowait(_CLOSED)

    def _take(self, message: dict[str, Any]) -> None:
        """What one message does; an ``ApiError`` saying why when it is refused (then it
        changes nothing)."""
        if message.get("bytes") is not None:
            frame = message["bytes"]
            if len(frame) % 2:
                _refuse("a binary frame holds whole PCM16 samples: an even number of bytes")
            if len(self.audio) + len(frame) > self.max_audio_bytes:
                _refuse(f"the input audio buffer would pass max_audio_bytes "
                        f"({self.max_audio_bytes}); this frame was dropped")  # fmt: skip
            self.audio += frame
            return
        try:
            request = json.loads(message.get("text") or "")
        except ValueError as exc:
            _refuse(f"not JSON: {exc}")
        kind = request.get("type") if isinstance(request, dict) else None
        if kind == "response.cancel":
            if self._answering is None:
                _refuse("response.cancel: no response is running")
            self._answering.cancel()
            return
        if kind == "input_audio.clear":
            self.audio.clear()
            return
        if self._requests.qsize() >= MAX_WAITING_REQUESTS:
            _refuse(f"at most {MAX_WAITING_REQUESTS} requests may wait behind the running one")
        said = None
        if kind == "chat" and "input_audio" in request:
            said = clip_message(request["input_audio"], bytes(self.audio), self.max_audio_seconds)
            self.audio.clear()
        self._requests.put_nowait((request, said))

    async def _close_idle(self) -> None:
        message = f"no request for {self.idle_timeout_s:g} s: closing the idle connection"
        await self.send({"type": "error", **error_body(message, code="idle_timeout")})
        await self.ws.close(IDLE_CLOSE_CODE, "idle timeout")
