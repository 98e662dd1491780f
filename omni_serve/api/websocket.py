"""One client connection of the audio WebSocket (``/v1/audio/stream``): requests one at a
time, a voice streamed in, an answer that can be cut short. The connection itself (reader,
sends, cancel, idle limit) is ``SocketSession``'s; this module is the protocol.

- Binary frames (PCM16 mono, the client's microphone) go into the connection's audio buffer;
  a chat with ``input_audio`` takes the buffer as its clip at that moment (so frames sent
  after it belong to the next one; a chat whose ``input_audio`` is refused takes nothing, so
  the client can send it again fixed without sending its voice again).
- ``response.cancel`` stops the answer running in every stage (so does the client leaving);
  other requests wait their turn.
- The client reads a frame after each audio event: the two are sent together even when the
  answer is cancelled between them.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
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
from omni_serve.api.socket_session import IDLE_CLOSE_CODE, IdleTimeout, SocketSession
from omni_serve.api.validation_errors import most_specific

__all__ = ["IDLE_CLOSE_CODE", "IdleTimeout", "VoiceSocket", "clip_message", "error_event"]

MAX_WAITING_REQUESTS = 8  # requests a client may queue behind the answer running
_CLOSED = object()


def error_event(exc: Exception) -> dict[str, Any]:
    """A request's failure as the error event the socket stays open after: the HTTP routes'
    error body, with the status left out."""
    if isinstance(exc, ApiError):
        return {"type": "error", **exc.body}
    if isinstance(exc, RequestTimeout):
        return {"type": "error", **error_body(str(exc), "timeout_error")}
    if isinstance(exc, ValidationError):
        error = most_specific(exc.errors())
        return {"type": "error", **error_body(error.message, param=error.param)}
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
        error = most_specific(exc.errors()).under("input_audio")
        raise ApiError(400, error.message, error.param) from None
    if not pcm:
        message = (
            "no audio was sent since the last clip (send it as binary frames of PCM16 "
            "mono samples before the chat)"
        )
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


class VoiceSocket(SocketSession):
    def __init__(
        self,
        ws: WebSocket,
        idle_timeout_s: float | None,
        max_audio_bytes: int,
        max_audio_seconds: float = float("inf"),
    ) -> None:
        super().__init__(ws, idle_timeout_s)
        self.max_audio_bytes, self.max_audio_seconds = max_audio_bytes, max_audio_seconds
        self.audio = bytearray()  # PCM16 frames not yet taken by a chat
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._done = False  # whether the answer running has sent its response.done

    async def next_request(self) -> tuple[Any, dict[str, Any] | None]:
        """The next request (parsed JSON), with the user message the clip it took from the
        audio buffer became (``clip_message``; ``None`` unless it asked for ``input_audio``).
        Raises ``WebSocketDisconnect`` once the client left, ``IdleTimeout`` (after telling it
        why and closing) when it fell silent."""
        while True:
            timeout = self.idle_left()
            try:
                if timeout is not None and timeout <= 0:
                    raise TimeoutError
                async with asyncio.timeout(timeout):  # (wait_for: see api/deadline.py)
                    item = await self._requests.get()
            except TimeoutError:
                if (self.idle_left() or 0) > 0:
                    continue  # a frame arrived meanwhile
                await self.close_idle()
                raise IdleTimeout from None
            if item is _CLOSED:
                raise WebSocketDisconnect(1000)
            return item

    async def answer(self, response_id: str, streaming: Coroutine[Any, Any, None]) -> None:
        """Runs ``streaming`` (which sends the answer), cut short by the client's
        ``response.cancel``: then ``response.done`` says ``cancelled``."""
        self._done = False
        task = self.start_answer(streaming)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # the connection's handler itself: stop the answer too
            task.cancel()
            raise
        if not task.cancelled():
            task.result()  # re-raises a disconnect
        elif self.gone:
            raise WebSocketDisconnect(1000)
        elif not self._done:  # (a cancel that came as the answer ended changes nothing)
            await self.send({"type": "response.done", "id": response_id, "status": "cancelled"})

    async def send(self, event: dict[str, Any], frame: bytes | None = None) -> None:
        self._done = self._done or event.get("type") == "response.done"
        await super().send(event, frame)

    def on_gone(self) -> None:
        self._requests.put_nowait(_CLOSED)

    async def take(self, message: dict[str, Any]) -> None:
        self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        """What one message does; an ``ApiError`` saying why when it is refused (then it
        changes nothing)."""
        if message.get("bytes") is not None:
            frame = message["bytes"]
            if len(frame) % 2:
                _refuse("a binary frame holds whole PCM16 samples: an even number of bytes")
            if len(self.audio) + len(frame) > self.max_audio_bytes:
                _refuse(
                    f"the input audio buffer would pass max_audio_bytes "
                    f"({self.max_audio_bytes}); this frame was dropped"
                )
            self.audio += frame
            return
        try:
            request = json.loads(message.get("text") or "")
        except ValueError as exc:
            _refuse(f"not JSON: {exc}")
        kind = request.get("type") if isinstance(request, dict) else None
        if kind == "response.cancel":
            if not self.cancel_answer():
                _refuse("response.cancel: no response is running")
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
