"""Server VAD's ``idle_timeout_ms``, as OpenAI's: a phone agent's "are you still there?".

Once an answer's audio has played out (its ``response.done`` plus what the client still had to
play), a user silent for ``idle_timeout_ms`` makes the session commit the input audio buffer
(silence, or speech too soft for the VAD) as a user item, announce it with
``input_audio_buffer.timeout_triggered``, and answer: the model prompts the user to go on.
Speech, a commit, another answer or a change of turn detection stops the clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_serve.api.realtime.answer import Answer
    from omni_serve.api.realtime.protocol import TurnDetection

log = logging.getLogger("ray.serve")


class IdlePrompt:
    """One pending timeout at most; ``start`` replaces it, ``cancel`` drops it."""

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None

    def after(
        self, answer: Answer, vad: TurnDetection, fire: Callable[[], Awaitable[None]]
    ) -> None:
        """Starts the clock for when ``answer`` has played out, unless the user spoke over
        it (then the turn is theirs) or ``vad`` sets no timeout."""
        if vad.idle_timeout_ms is None or answer.reason in ("turn_detected", "discarded"):
            return
        self.start(answer.playback_left_s() + vad.idle_timeout_ms / 1000, fire)

    def start(self, after_s: float, fire: Callable[[], Awaitable[None]]) -> None:
        self.cancel()
        self._task = asyncio.create_task(self._wait(after_s, fire))

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _wait(self, after_s: float, fire: Callable[[], Awaitable[None]]) -> None:
        await asyncio.sleep(after_s)
        self._task = None  # fired: what it starts must not cancel it
        try:
            await fire()
        except Exception:  # a session's own fault; the session goes on
            log.exception("realtime: the idle timeout's answer failed to start")
