"""Tensor channel: ``TensorRef`` plus backends (inline, object store); chosen per edge."""

from __future__ import annotations

from omni_serve.transport.base import Channel, ChannelError, Payload, TensorRef, payload_spec
from omni_serve.transport.inline import InlineChannel
from omni_serve.transport.object_store import ObjectStoreChannel

_BACKENDS = {"inline": InlineChannel, "object_store": ObjectStoreChannel}


class AutoChannel:
    """Inline up to ``inline_max_bytes``, the object store above (more backends: issue 5)."""

    name = "auto"

    def __init__(self, inline_max_bytes: int = 64 * 1024, large: Channel | None = None) -> None:
        self.inline_max_bytes = inline_max_bytes
        self.small = InlineChannel()
        self.large = large or ObjectStoreChannel()

    def put(self, payload: Payload) -> TensorRef:
        nbytes, _ = payload_spec(payload)
        return (self.small if nbytes <= self.inline_max_bytes else self.large).put(payload)

    async def get(self, ref: TensorRef) -> Payload:
        return await backend_for(ref).get(ref)

    def free(self, ref: TensorRef) -> None:
        backend_for(ref).free(ref)


def backend_for(ref: TensorRef) -> Channel:
    try:
        return _BACKENDS[ref.backend]()
    except KeyError:
        raise ChannelError(f"unknown channel backend {ref.backend!r}") from None


async def take(ref: TensorRef) -> Payload:
    """Read a ref's tensors and free it: the consumer of a one-reader edge owns the ref."""
    channel = backend_for(ref)
    try:
        return await channel.get(ref)
    finally:
        channel.free(ref)


def make_channel(backend: str = "auto", inline_max_bytes: int = 64 * 1024) -> Channel:
    """The channel an edge's ``ChannelSettings`` ask for."""
    if backend == "auto":
        return AutoChannel(inline_max_bytes)
    if backend not in _BACKENDS:
        raise ValueError(f"channel backend {backend!r} is not available yet")
    return _BACKENDS[backend]()


__all__ = [
    "AutoChannel",
    "Channel",
    "ChannelError",
    "InlineChannel",
    "ObjectStoreChannel",
    "TensorRef",
    "backend_for",
    "make_channel",
    "take",
]
