"""A reply's chunk decodes in flight, handed back in the order of the stream.

A codec that decodes every chunk from its own window (Qwen2.5-Omni's Token2Wav) lets the next
chunk decode while the last one still runs, on another codec replica: one reply then uses as
many cores as it has chunks in flight, where awaiting each decode before reading on held a
reply to one core however many replicas served it. A codec that carries a stream's state
from chunk to chunk (Qwen3-Omni's Code2wav) keeps one in flight: each decode is awaited
before the flow reads on, as it always was.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np

from omni_serve.engines.codec.chunked import DecodeJob

Decode = Callable[[list[DecodeJob]], Awaitable[list[np.ndarray]]]


class ChunkDecodes:
    """At most ``in_flight`` calls of ``decode`` at once; their audio in submission order.
    ``NONE``: a text reply's, which decodes nothing."""

    NONE: ChunkDecodes

    def __init__(self, decode: Decode, in_flight: int = 1) -> None:
        if in_flight < 1:
            raise ValueError(f"chunks in flight must be at least 1, got {in_flight}")
        self._decode = decode
        self._in_flight = in_flight
        self._pending: deque[asyncio.Task[list[np.ndarray]]] = deque()

    def start(self, jobs: list[DecodeJob]) -> None:
        """Start decoding ``jobs`` without waiting for any decode (a reply's last chunk)."""
        self._pending.append(asyncio.ensure_future(self._decode(jobs)))

    async def submit(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        """Start decoding ``jobs``; returns the audio now ready in order, having waited for
        the oldest decodes while ``in_flight`` of them run."""
        self.start(jobs)
        ready = []
        while len(self._pending) >= self._in_flight:
            ready += await self._pending.popleft()
        return ready + await self.ready()

    async def ready(self) -> list[np.ndarray]:
        """The audio of the oldest decodes that have finished, without waiting."""
        ready = []
        while self._pending and self._pending[0].done():
            ready += await self._pending.popleft()
        return ready

    async def drain(self) -> AsyncIterator[np.ndarray]:
        """All the audio still to come, in order, each decode's as soon as it is done."""
        while self._pending:
            for piece in await self._pending.popleft():
                yield piece

    async def aclose(self) -> None:
        """Cancel what still runs (a reply cancelled or failed): its refs are freed now."""
        pending, self._pending = list(self._pending), deque()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _no_codec(jobs: list[DecodeJob]) -> list[np.ndarray]:
    raise RuntimeError("a text reply has no codec to decode audio with")


ChunkDecodes.NONE = ChunkDecodes(_no_codec)
