"""A reply's chunk decodes: at most so many at once, their audio in the stream's order, and
nothing left running when the reply ends early."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omni_serve.engines.codec.chunked import DecodeJob
from omni_serve.models.thinker_talker.chunk_decodes import ChunkDecodes


class SlowCodec:
    """Decodes chunk i in ``delays[i]`` seconds to one sample of value i, counting how many
    run at once and which were cancelled."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.running = self.most = 0
        self.started: list[int] = []
        self.cancelled: list[int] = []

    async def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        i = jobs[0].first_frame
        self.started.append(i)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delays[i])
        except asyncio.CancelledError:
            self.cancelled.append(i)
            raise
        finally:
            self.running -= 1
        return [np.full(1, i, np.float32)]


def job(i: int) -> list[DecodeJob]:
    return [DecodeJob(np.zeros((1, 1)), 0, 1, first_frame=i, num_frames=1)]


async def run(codec: SlowCodec, in_flight: int, chunks: int) -> list[float]:
    decodes = ChunkDecodes(codec.decode, in_flight)
    audio = []
    for i in range(chunks):
        audio += await decodes.submit(job(i))
    audio += [piece async for piece in decodes.drain()]
    return [float(a[0]) for a in audio]


async def test_later_chunks_finishing_first_still_come_in_order():
    codec = SlowCodec([0.05, 0.01, 0.03, 0.0, 0.02])
    assert await run(codec, 2, 5) == [0, 1, 2, 3, 4]
    assert codec.most == 2


async def test_one_in_flight_waits_for_each_decode():
    """A codec carrying a stream's state decodes its chunks one after another."""
    codec = SlowCodec([0.02, 0.0, 0.01])
    decodes = ChunkDecodes(codec.decode, 1)
    for i in range(3):
        assert [float(a[0]) for a in await decodes.submit(job(i))] == [i]
    assert codec.most == 1


async def test_ready_hands_back_only_what_has_finished():
    codec = SlowCodec([0.0, 10.0])
    decodes = ChunkDecodes(codec.decode, 3)
    assert await decodes.submit(job(0)) == []  # started, not finished
    await asyncio.sleep(0.01)
    assert await decodes.submit(job(1)) != []  # chunk 0's audio, chunk 1 still running
    await asyncio.sleep(0.01)
    assert await decodes.ready() == [] and codec.running == 1
    await decodes.aclose()
    assert codec.cancelled == [1]


async def test_closing_cancels_every_decode_still_running():
    codec = SlowCodec([10.0, 10.0])
    decodes = ChunkDecodes(codec.decode, 3)
    await decodes.submit(job(0))
    await decodes.submit(job(1))
    await asyncio.sleep(0.01)
    await decodes.aclose()
    assert sorted(codec.cancelled) == [0, 1] and codec.running == 0
    assert [piece async for piece in decodes.drain()] == []


async def test_draining_hands_each_decode_back_as_soon_as_it_is_done():
    """A reply's last chunks: the earlier one's audio goes out while the later one decodes."""
    codec = SlowCodec([0.0, 10.0])
    decodes = ChunkDecodes(codec.decode, 3)
    decodes.start(job(0))
    decodes.start(job(1))
    drain = decodes.drain()
    first = await asyncio.wait_for(anext(drain), 1.0)
    assert float(first[0]) == 0 and codec.running == 1
    await drain.aclose()
    await decodes.aclose()
    assert codec.cancelled == [1]


def test_fewer_than_one_in_flight_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ChunkDecodes(SlowCodec([]).decode, 0)
