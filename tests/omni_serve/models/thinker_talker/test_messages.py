"""Streamed stage messages cross a handle as plain values (msgpack packs them, as Ray does
for plain values; anything else goes through pickle, ~0.1 ms more per item) and come back
equal; requests pickle back equal."""

from __future__ import annotations

import msgpack
from ray import cloudpickle

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.thinker_talker.messages import (
    CodecFrame,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
    decoded,
    from_wire,
    to_wire,
)


def test_streamed_items_go_as_plain_values_and_come_back_equal():
    chunk = ThinkerChunk([5, 6], "hi", True, "stop", 1, 12, 4, [1, 2, 3], None, "kv")
    for item in (chunk, CodecFrame(list(range(16)))):
        wire = msgpack.unpackb(msgpack.packb(to_wire(item)))  # raises on a non-plain value
        assert from_wire(wire) == item and type(from_wire(wire)) is type(item)


def test_a_request_pickles_back_equal():
    thinker = ThinkerRequest("r", [1, 2], SamplingConfig(seed=3), capture=True, session_id="s")
    request = SpeakRequest("r", thinker, [1, 2], "ethan", {"temperature": 0.5}, reply_ids=[7])
    assert cloudpickle.loads(cloudpickle.dumps(request)) == request


async def test_closing_the_decoded_stream_closes_its_source_at_once():
    """A cancelled reply must stop its stages now: the source's cleanup (handle_calls.stream
    cancels the stage call there) runs when the decoded stream is closed, not at collection."""
    closed = []

    async def source():
        try:
            for i in range(10):
                yield to_wire(CodecFrame([i]))
        finally:
            closed.append(True)

    stream = decoded(source())
    assert await stream.__anext__() == CodecFrame([0])
    await stream.aclose()
    assert closed == [True]
