"""Stage calls from the ingress: one retry when the replica died before answering, never
after a stream has yielded (then ReplicaDied names the stage); Serve's "no room" errors become
a 503-worthy StageUnavailable; a caller that stops waiting cancels the stage's request."""

from __future__ import annotations

import asyncio

import pytest
import torch
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from deployments import handle_calls
from omni_serve.api.errors import ReplicaDied, StageUnavailable
from omni_serve.transport import ChannelError


def thinker_died() -> ActorDiedError:
    """As Ray 2.60 raises it when a Thinker replica's process is killed."""
    context = ActorDiedErrorContext(class_name="ServeReplica:default:thinker", actor_id=bytes(16))
    return ActorDiedError(context)


class FakeResponse:
    """Stands in for DeploymentResponse / DeploymentResponseGenerator."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome  # a value, an exception, or a list of items / exceptions
        self.cancelled = False

    def __await__(self):
        async def answer():
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            if self.outcome == "hang":
                await asyncio.sleep(3600)
            return self.outcome

        return answer().__await__()

    async def _items(self):
        for item in self.outcome:
            if isinstance(item, BaseException):
                raise item
            yield item

    def __aiter__(self):
        return self._items()

    def cancel(self) -> None:
        self.cancelled = True


class FakeMethod:
    def __init__(self, *outcomes) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[FakeResponse] = []

    def remote(self, *args):
        self.sent.append(FakeResponse(self.outcomes.pop(0)))
        return self.sent[-1]


async def test_a_call_whose_replica_died_is_sent_again_once():
    method = FakeMethod(ActorDiedError(), "decoded")
    assert await handle_calls.call(method, "x") == "decoded" and len(method.sent) == 2
    twice = FakeMethod(ActorDiedError(), thinker_died())
    with pytest.raises(ReplicaDied) as died:
        await handle_calls.call(twice)
    assert died.value.stage == "thinker" and "'thinker' died" in str(died.value)


async def test_a_stream_is_retried_only_before_its_first_item():
    fresh = FakeMethod([ActorDiedError()], ["a", "b"])
    assert [x async for x in handle_calls.stream(fresh)] == ["a", "b"]
    started = FakeMethod(["a", ActorDiedError()], ["never"])
    got = []
    with pytest.raises(ReplicaDied) as died:
        async for item in handle_calls.stream(started):
            got.append(item)
    assert got == ["a"] and len(started.sent) == 1
    assert died.value.stage is None and "a replica of a stage died" in str(died.value)


async def test_a_request_is_run_again_from_the_start_once_after_a_replica_death():
    runs = []

    async def run():
        runs.append(1)
        if len(runs) == 1:
            raise ReplicaDied("talker")
        return "whole answer"

    assert await handle_calls.rerun_after_replica_death(run) == "whole answer" and len(runs) == 2

    async def always_dies():
        raise ReplicaDied("talker")

    with pytest.raises(ReplicaDied):
        await handle_calls.rerun_after_replica_death(always_dies)

    async def bad_input():
        runs.append(1)
        raise ValueError("not a replica death")

    runs.clear()
    with pytest.raises(ValueError):
        await handle_calls.rerun_after_replica_death(bad_input)
    assert len(runs) == 1


async def test_backpressure_becomes_stage_unavailable_with_retry_after():
    full = BackPressureError(num_queued_requests=4, max_queued_requests=4, retry_after_s=2.0)
    with pytest.raises(StageUnavailable) as busy:
        await handle_calls.call(FakeMethod(full))
    assert busy.value.retry_after_s == 2.0 and "max_queued_requests=4" in str(busy.value)
    with pytest.raises(StageUnavailable):
        async for _ in handle_calls.stream(FakeMethod([full])):
            pass


async def test_a_caller_that_stops_waiting_cancels_the_stage_request():
    method = FakeMethod("hang")
    task = asyncio.ensure_future(handle_calls.call(method))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert method.sent[0].cancelled
    streaming = FakeMethod(["a", "b"])
    items = handle_calls.stream(streaming)
    assert await anext(items) == "a"
    await items.aclose()
    assert streaming.sent[0].cancelled


async def test_a_call_that_ended_frees_the_refs_no_consumer_read():
    """Refused (backpressure), cancelled while queued at the replica, failed, or answered: the
    refs it carried that no consumer read (nested ones too) are freed at once instead of
    waiting for the producer's lease; one a consumer read (a replica that died reading it) is
    left to the consumer's side."""
    from omni_serve.transport import ChannelError, make_channel

    channel = make_channel("shared_memory")
    full = BackPressureError(num_queued_requests=1, max_queued_requests=1, retry_after_s=1.0)
    prompt, latents, nested, read, cancelled, unused = (
        channel.put(torch.ones(4)) for _ in range(6)
    )
    with pytest.raises(StageUnavailable):
        request = {"prompt": prompt, "thinker": {"rows": [nested]}}
        await handle_calls.call(FakeMethod(full), request, [latents], 3)
    view = await channel.get(read)  # the consumer read it, then its replica died
    with pytest.raises(ReplicaDied):
        await handle_calls.call(FakeMethod(ActorDiedError(), ActorDiedError()), read)
    task = asyncio.ensure_future(handle_calls.call(FakeMethod("hang"), cancelled))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await handle_calls.call(FakeMethod("done"), {"unused": unused}) == "done"
    for ref in (prompt, latents, nested, cancelled, unused):
        with pytest.raises(ChannelError, match="freed"):
            await channel.get(ref)
    assert torch.equal(view, torch.ones(4)) and torch.equal(await channel.get(read), view)
    channel.free(read)


async def test_a_retried_call_keeps_its_refs_for_the_second_replica():
    from omni_serve.transport import make_channel
    from omni_serve.transport import shared_memory as shm

    channel = make_channel("shared_memory")
    ref = channel.put(torch.arange(6.0))
    states = []

    class Recording(FakeMethod):
        def remote(self, *args):
            with open(shm.SHM_DIR / ref.key, "rb") as f:
                states.append(shm.HEADER.unpack(f.read(shm.HEADER.size))[1])
            return super().remote(*args)

    assert await handle_calls.call(Recording(ActorDiedError(), "ok"), ref) == "ok"
    assert states == [shm.IN_USE, shm.IN_USE]  # still there for the replacement replica


def vae_died() -> ActorDiedError:
    context = ActorDiedErrorContext(class_name="ServeReplica:default:vae", actor_id=bytes(16))
    return ActorDiedError(context)


async def test_a_retry_whose_inputs_the_dead_replica_consumed_names_that_replica():
    lost = FakeMethod(vae_died(), ChannelError("ref omni-shm-1-p-x was freed"))
    with pytest.raises(ReplicaDied) as died:
        await handle_calls.call(lost, "latents")
    assert died.value.stage == "vae"
    streamed = FakeMethod([vae_died()], [ChannelError("ref omni-shm-1-p-x was freed")])
    with pytest.raises(ReplicaDied):
        _ = [x async for x in handle_calls.stream(streamed)]


async def test_a_channel_error_without_a_replica_death_is_the_stages_own():
    with pytest.raises(ChannelError):
        await handle_calls.call(FakeMethod(ChannelError("ref was freed")))
