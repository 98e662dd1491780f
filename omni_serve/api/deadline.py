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


# Deadlines use ``asyncio.timeout``, not ``asyncio.wait_for``: on Python 3.11, ``wait_for``
# swallows a cancellation that comes as the awaited item completes (CPython gh-86296, fixed in
# 3.12), and a stream being read item by item meets that often. A barge-in then failed to stop
# an answer, which ran to its end (12 s) before anything noticed.


async def await_within(awaitable: Awaitable[T], seconds: float | None) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise RequestTimeout(seconds) from None


async def iterate_within(events: AsyncIterator[T], seconds: float | None) -> AsyncIterator[T]:
    """``events`` until the deadline (``None``: none); then ``events`` is closed and
    RequestTimeout raised. Closed early (a cancel, a client that left), it closes ``events``
    at once, which stops the stages behind them: left to the garbage collector, that can
    happen much later.

    Time the consumer spends between items counts: the deadline is on the whole request.
    """
    loop = asyncio.get_running_loop()
    end = None if seconds is None else loop.time() + seconds
    iterator = aiter(events)
    try:
        while True:
            try:
                async with asyncio.timeout_at(end):
                    event = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise RequestTimeout(seconds) from None
            yield event
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
