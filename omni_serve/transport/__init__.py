"""Tensor channel: ``TensorRef`` plus backends (inline, shared memory, object store, direct);
chosen per edge, by default by size and locality (``channels.py``)."""

from omni_serve.transport.base import (
    Channel,
    ChannelError,
    ChannelFull,
    Reservation,
    TensorRef,
)
from omni_serve.transport.channels import (
    AutoChannel,
    backend_for,
    channel_stats,
    close,
    make_channel,
    release,
    take,
)
from omni_serve.transport.direct import DirectChannel
from omni_serve.transport.hosts import announce
from omni_serve.transport.inline import InlineChannel
from omni_serve.transport.object_store import ObjectStoreChannel
from omni_serve.transport.shared_memory import SharedMemoryChannel
from omni_serve.transport.shared_memory_direct import SharedMemoryDirectChannel

__all__ = [
    "AutoChannel",
    "Channel",
    "ChannelError",
    "ChannelFull",
    "DirectChannel",
    "InlineChannel",
    "ObjectStoreChannel",
    "Reservation",
    "SharedMemoryChannel",
    "SharedMemoryDirectChannel",
    "TensorRef",
    "announce",
    "backend_for",
    "channel_stats",
    "close",
    "make_channel",
    "release",
    "take",
]
