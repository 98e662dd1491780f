"""Server-side request deadlines.

A request that outlives its deadline is cancelled the same way a client disconnect cancels it:
the awaiting coroutine is cancelled, which closes the Serve response generators it was reading,
and Serve propagates that cancellation into every stage still working on the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

T = TypeVar("T")


class RequestTimeout(Exception):
    """The request ran past its deadline; its work in every stage has been cancelled."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request exceeded its {seconds:g} s deadline and was cancelled")
        self.seconds = seconds


def request_deadline(asked: float | None, server_limit: float | None) -> float | None:
    """The tighter of what the request asked for and the server's limit (None = no limit)."""
    limits = [s for s in (asked, server_limit) if s is not None]
    return min(limits) if limits else None


async def await_within(awaitable: Awaitable[T], seconds: float | None) -> T:
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise RequestTimeout(seconds) from None


async def iterate_within(events: AsyncIterator[T], seconds: float | None) -> AsyncIterator[T]:
    """``events`` until the deadline; then ``events`` is closed and RequestTimeout raised.

    Time the consumer spends between items counts: the deadline is on the whole request.
    """
    if seconds is None:
        async for event in events:
            yield event
        return
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    iterator = aiter(events)
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(iterator), max(0.0, end - loop.time()))
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise RequestTimeout(seconds) from None
            yield event
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
