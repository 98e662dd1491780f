"""Talking to a Realtime connection (the ``openai`` client's) in tests: a user's text item, and
the events up to one."""

from __future__ import annotations

import asyncio
from typing import Any


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
