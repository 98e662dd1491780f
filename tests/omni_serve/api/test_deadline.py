"""Request deadlines cancel the request's work and say so."""

from __future__ import annotations

import asyncio

import pytest

from omni_serve.api.deadline import (
    RequestTimeout,
    await_within,
    iterate_within,
    request_deadline,
)


class SlowStage:
    """Yields ``count`` items ``delay`` apart; records whether it was cancelled/closed."""

    def __init__(self, count: int, delay: float) -> None:
        self.count, self.delay = count, delay
        self.cancelled = self.closed = False

    async def events(self):
        try:
            for i in range(self.count):
                await asyncio.sleep(self.delay)
                yield i
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


def test_deadline_is_the_tighter_limit():
    assert request_deadline(None, None) is None
    assert request_deadline(5.0, None) == 5.0
    assert request_deadline(None, 600.0) == 600.0
    assert request_deadline(900.0, 600.0) == 600.0
    assert request_deadline(2.0, 600.0) == 2.0


async def test_a_stream_past_its_deadline_is_cancelled_mid_wait():
    stage = SlowStage(count=100, delay=0.05)
    seen = []
    with pytest.raises(RequestTimeout, match="0.3 s deadline"):
        async for item in iterate_within(stage.events(), 0.3):
            seen.append(item)
    assert 2 <= len(seen) < 10
    assert stage.cancelled and stage.closed


async def test_time_the_consumer_spends_counts():
    stage = SlowStage(count=100, delay=0.0)
    with pytest.raises(RequestTimeout):
        async for _ in iterate_within(stage.events(), 0.2):
            await asyncio.sleep(0.05)  # e.g. the client reading slowly
    assert stage.closed


async def test_a_stream_within_its_deadline_is_untouched():
    stage = SlowStage(count=5, delay=0.01)
    assert [i async for i in iterate_within(stage.events(), 10.0)] == [0, 1, 2, 3, 4]
    assert [i async for i in iterate_within(SlowStage(3, 0).events(), None)] == [0, 1, 2]
    assert not stage.cancelled


async def test_await_within_cancels_the_awaited_work():
    stage = SlowStage(count=100, delay=0.05)

    async def collect():
        return [i async for i in stage.events()]

    with pytest.raises(RequestTimeout):
        await await_within(collect(), 0.2)
    assert stage.cancelled
    assert await await_within(asyncio.sleep(0, result=7), 1.0) == 7


async def test_a_cancel_that_comes_as_an_item_arrives_stops_the_stream():
    """Python 3.11's ``asyncio.wait_for`` swallows such a cancel: the stream read on as if
    nothing had happened (a barge-in that did not stop the answer)."""
    ready: list[asyncio.Future] = []

    async def items():
        while True:
            ready.append(asyncio.get_running_loop().create_future())
            await ready[-1]
            yield 1

    async def read():
        async for _ in iterate_within(items(), 60):
            pass

    for _ in range(5):  # the race is exact: every round lands on it
        ready.clear()
        reader = asyncio.create_task(read())
        await asyncio.sleep(0.01)
        ready[-1].set_result(None)  # the item arrives...
        await asyncio.sleep(0)  # ...its anext task completes on this turn of the loop
        reader.cancel()  # ...as the reader is cancelled
        done, _ = await asyncio.wait([reader], timeout=1)
        assert done and reader.cancelled()


@pytest.mark.parametrize("seconds", [None, 60.0])
async def test_a_stream_closed_early_closes_its_source_at_once(seconds):
    """A cancelled answer stops its stages: the source is closed when the stream is, with or
    without a deadline, not when the garbage collector gets to it."""
    closed = asyncio.Event()

    async def source():
        try:
            for i in range(100):
                yield i
        finally:
            closed.set()

    stream = iterate_within(source(), seconds)
    assert await anext(stream) == 0
    await stream.aclose()
    assert closed.is_set()
