"""The connection core every voice WebSocket shares (``/v1/audio/stream``'s ``VoiceSocket``,
``/v1/realtime``'s ``RealtimeSession``): what they differ in is only what a message means.

- A reader task takes every message as it arrives, also while an answer streams, and hands
  it to ``take``; an ``ApiError`` from ``take`` is sent back as an error event and the
  connection stays.
- Sends go through one lock and are shielded from cancellation, so an event and the binary
  frame that goes with it are never split, and an event is never half sent.
- One answer runs at a time, as a task that a cancel (or the client leaving) stops; its
  stages stop with it through the answer's own ``aclosing``.
- An open WebSocket holds one of the ingress replica's ``max_ongoing_requests`` slots for as
  long as it lives, so a client that sends nothing for ``idle_timeout_s`` (counted from its
  last message or the end of its last answer) is told so and disconnected.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omni_serve.api.errors import ApiError
from omni_serve.api.protocol import error_body

IDLE_CLOSE_CODE = 1000  # a normal close: the server ended an idle session


class IdleTimeout(Exception):
    pass


class SocketSession(ABC):
    def __init__(self, ws: WebSocket, idle_timeout_s: float | None) -> None:
        self.ws, self.idle_timeout_s = ws, idle_timeout_s
        self._send_lock = asyncio.Lock()
        self._answering: asyncio.Task | None = None
        self._gone = asyncio.Event()  # set once the client has left
        self._last_heard = time.monotonic()
        # Runs from the caller's next await, so a subclass sets its state after this call.
        self._reader = asyncio.create_task(self._read())

    @abstractmethod
    async def take(self, message: dict[str, Any]) -> None:
        """What one message (``ws.receive()``'s dict) does; an ``ApiError`` refuses it."""

    def refusal(self, refused: ApiError) -> dict[str, Any]:
        """The error event a refused message is answered with."""
        return {"type": "error", **refused.body}

    def on_gone(self) -> None:  # noqa: B027 (a hook: most sessions need nothing here)
        """Called once the client has left (the reader's last act)."""

    @property
    def answering(self) -> bool:
        return self._answering is not None and not self._answering.done()

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def start_answer(self, streaming: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Runs ``streaming`` (which sends the answer) as the one answer in progress."""
        assert not self.answering, "one answer at a time"
        self._answering = task = asyncio.create_task(streaming)
        task.add_done_callback(self._answer_ended)
        return task

    def cancel_answer(self) -> bool:
        """Stops the answer in progress; whether there was one."""
        if not self.answering:
            return False
        self._answering.cancel()
        return True

    def idle_left(self) -> float | None:
        """Seconds until the idle limit (``None``: no limit; never counts while answering)."""
        if self.idle_timeout_s is None:
            return None
        if self.answering:
            return self.idle_timeout_s
        return self.idle_timeout_s - (time.monotonic() - self._last_heard)

    async def until_idle_or_gone(self) -> None:
        """Returns when the client leaves; raises ``IdleTimeout`` (after telling it why and
        closing) once it has been silent for ``idle_timeout_s``."""
        while not self.gone:
            left = self.idle_left()
            try:
                async with asyncio.timeout(left if left is None else max(left, 0)):
                    await self._gone.wait()
            except TimeoutError:
                if (self.idle_left() or 0) <= 0 and not self.gone:
                    await self.close_idle()
                    raise IdleTimeout from None

    async def send(self, event: dict[str, Any], frame: bytes | None = None) -> None:
        """One event, and the binary frame that goes with it, never split by a cancel."""
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

    async def close_idle(self) -> None:
        message = f"no request for {self.idle_timeout_s:g} s: closing the idle connection"
        await self.send({"type": "error", **error_body(message, code="idle_timeout")})
        await self.ws.close(IDLE_CLOSE_CODE, "idle timeout")

    def _answer_ended(self, _: asyncio.Task) -> None:
        self._last_heard = time.monotonic()  # the idle clock starts after the answer

    async def _read(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                self._last_heard = time.monotonic()
                try:
                    await self.take(message)
                except ApiError as refused:
                    await self.send(self.refusal(refused))
        except (WebSocketDisconnect, RuntimeError):  # gone, or closed by the server
            return
        finally:  # nobody is listening: stop the answer's work in every stage
            self._gone.set()
            if self._answering is not None:
                self._answering.cancel()
            self.on_gone()
