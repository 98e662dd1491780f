"""Shared memory that readers on other hosts can read too: for clusters that span hosts.

A producer cannot know where its consumer will run: the handle call carrying the ref is routed
after the put. So once the cluster spanned hosts, ``auto`` sent every large payload over
direct, and a consumer on the producer's own host paid direct's two copies (into the owner's
buffer, out into the reader's) where shared memory makes one. This backend puts a payload once
into a pooled shared-memory segment that is also registered with this process's NIXL agent
(once per segment, as the pool reuses them): a consumer on the producer's host maps it
zero-copy, as ``shared_memory``; one on another host reads it over NIXL, as ``direct``, and its
free (or a caller's abandon) reaches the owner as a notification, which releases the segment
as a local consumer would. The segment's header starts as the direct backend's does
(generation, state), so a remote read is checked the same way.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import torch

from omni_serve.transport import shared_memory
from omni_serve.transport.base import ALIGN, Payload, Reservation, TensorRef
from omni_serve.transport.direct import DirectChannel
from omni_serve.transport.direct_endpoint import endpoint
from omni_serve.transport.hosts import host_id
from omni_serve.transport.shared_memory import SharedMemoryChannel

_lent: dict[str, tuple[int, torch.Tensor]] = {}  # segment -> (its index with the agent, memory)
_lock = threading.Lock()


def _lend(name: str) -> tuple[int, torch.Tensor]:
    with _lock:
        if name not in _lent:
            view, in_use = shared_memory.producer_segment(name)
            memory = torch.frombuffer(view, dtype=torch.uint8)

            def release(verb: str, generation: int) -> None:
                shared_memory.release_segment(name, generation, unread_only=verb == "abandon")

            _lent[name] = (endpoint().lend(memory, in_use, release), memory)
        return _lent[name]


def _unlinking(name: str) -> None:
    """Before the pool unlinks a segment (and unmaps it): no reader may reach it over NIXL."""
    with _lock:
        lent = _lent.pop(name, None)
    if lent is not None:
        endpoint().take_back(lent[0])


shared_memory.on_unlink(_unlinking)


def _local(ref: TensorRef) -> TensorRef:
    """The shared-memory ref inside ``ref``."""
    return replace(ref, backend=SharedMemoryChannel.name, handle=ref.handle[0])


def _remote(ref: TensorRef) -> TensorRef:
    """The direct ref inside ``ref``."""
    return replace(ref, backend=DirectChannel.name, handle=ref.handle[1])


def _here(ref: TensorRef) -> bool:
    return ref.handle[0][0] == host_id()


class SharedMemoryDirectChannel:
    """Payloads the pool cannot take raise ``ChannelFull`` (``auto`` then uses the object
    store): a one-shot segment, registered for one read, would cost more than that."""

    name = "shared_memory_direct"

    def __init__(self) -> None:
        self.local = SharedMemoryChannel(pooled_only=True)

    def put(self, payload: Payload) -> TensorRef:
        return self._with_where(self.local.put(payload))

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        reservation = self.local.reserve(like, device)
        commit = reservation.commit
        return replace(reservation, commit=lambda: self._with_where(commit()))

    def _with_where(self, ref: TensorRef) -> TensorRef:
        """``ref`` with what a reader on another host needs beside it."""
        _, generation, _, offsets, keys, _ = ref.handle
        try:
            index, memory = _lend(ref.key)
            size = max([ALIGN, *(offset + nbytes for offset, nbytes in offsets.values())])
            owner = endpoint()
            where = owner.where(index, memory, generation, size, offsets, keys)
            owner.put_lent()
        except BaseException:
            self.local.free(ref)
            raise
        return replace(ref, backend=self.name, handle=(ref.handle, where))

    async def get(self, ref: TensorRef) -> Payload:
        if _here(ref):
            return await self.local.get(_local(ref))
        return await DirectChannel(gpu_consumer=False).get(_remote(ref))

    def free(self, ref: TensorRef) -> None:
        if _here(ref):
            self.local.free(_local(ref))
        else:
            endpoint().hand_back(ref.handle[1])

    def abandon(self, ref: TensorRef) -> None:
        """Freed unless a consumer read it: on this host the segment's state says so; from
        another host the owner checks it when the notification arrives."""
        if _here(ref):
            self.local.abandon(_local(ref))
        else:
            endpoint().hand_back(ref.handle[1], "abandon")
