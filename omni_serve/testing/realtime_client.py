"""Talking to a Realtime connection (the ``openai`` client's) in tests: a user's text item,
audio streamed into the input buffer, and the events up to one."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from omni_serve.testing.speech_clip import pcm16


async def until(conn: Any, kind: str, timeout: float = 120) -> list[Any]:
    """The events up to and including the first of type ``kind``."""
    seen = []
    async with asyncio.timeout(timeout):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return seen
    raise AssertionError(f"the connection closed before {kind}")


async def until_each(conn: Any, kinds: set[str], timeout: float = 120) -> list[Any]:
    """The events up to the first of each type in ``kinds``, which may come in any order
    (a turn's transcript and its answer, say)."""
    seen, left = [], set(kinds)
    async with asyncio.timeout(timeout):
        async for event in conn:
            seen.append(event)
            left.discard(event.type)
            if not left:
                return seen
    raise AssertionError(f"the connection closed before {sorted(left)}")


def user_text(text: str) -> dict:
    """A ``conversation.item.create`` item: the user says ``text``."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def send_audio(conn: Any, samples: np.ndarray, real_time: bool = False) -> None:
    """Streams float ``samples`` (24 kHz) into the input buffer in 100 ms appends: as fast as
    the socket takes them, or one every 100 ms as a microphone sends them."""
    pcm = pcm16(samples)
    for i in range(0, len(pcm), 4800):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 4800]).decode())
        if real_time:
            await asyncio.sleep(0.1)
