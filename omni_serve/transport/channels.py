"""Choosing a channel backend for an edge (``make_channel``, ``AutoChannel``), and what works on
any ref whatever its backend: ``take``, ``release``, ``backend_for``; this process's channel
``close`` and ``channel_stats``."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from omni_serve.compat.nixl import nixl_available
from omni_serve.transport.base import (
    Channel,
    ChannelError,
    ChannelFull,
    Payload,
    Reservation,
    TensorRef,
    gpu_of,
    payload_spec,
)
from omni_serve.transport.direct import DirectChannel
from omni_serve.transport.hosts import announce, cluster_is_one_host, ray_is_running
from omni_serve.transport.inline import InlineChannel
from omni_serve.transport.object_store import ObjectStoreChannel
from omni_serve.transport.shared_memory import SharedMemoryChannel, pool_bytes, unlink_pool
from omni_serve.transport.shared_memory_direct import SharedMemoryDirectChannel
from omni_serve.transport.stats import counts

logger = logging.getLogger(__name__)
_BACKENDS = {
    "inline": InlineChannel,
    "object_store": ObjectStoreChannel,
    "shared_memory": SharedMemoryChannel,
    "direct": DirectChannel,
    "shared_memory_direct": SharedMemoryDirectChannel,
}
LOCALITY_TTL_S = 60.0
UNSETTLED_TTL_S = 1.0
# A GPU payload from this size up goes GPU to GPU (direct backend); smaller ones through host
# memory. A direct GPU read has a floor of ~2 ms (two CUDA IPC reads: payload, then the header
# check) where the host path costs ~0.3 ms/MB: measured on an H100 (bench_channel_gpu.py),
# 1 MB 0.75-1.1 ms via host vs 1.9-2.3 ms direct, 16 MB 4.5-5.9 vs 1.9-2.3 ms.
GPU_DIRECT_MIN_BYTES = 4 << 20


class AutoChannel:
    """Inline up to ``inline_max_bytes``; above, direct (NIXL) for a payload of at least
    ``GPU_DIRECT_MIN_BYTES`` on a GPU where NIXL is installed and the consumer has a GPU (GPU
    to GPU; every other backend goes through host memory), else shared memory while the
    cluster is one host (checked once a minute), else shared memory that readers on other
    hosts read over NIXL (``shared_memory_direct``) where installed, else the object store.
    ``large`` pins the large-payload backend."""

    name = "auto"

    def __init__(
        self,
        inline_max_bytes: int = 64 * 1024,
        large: Channel | None = None,
        gpu_consumer: bool = True,
    ) -> None:
        self.inline_max_bytes = inline_max_bytes
        self.small = InlineChannel()
        self.large = large
        self.gpu_consumer = gpu_consumer
        self._local, self._checked, self._ttl = True, float("-inf"), LOCALITY_TTL_S

    def put(self, payload: Payload) -> TensorRef:
        nbytes, _ = payload_spec(payload)
        if nbytes <= self.inline_max_bytes:
            return self.small.put(payload)
        try:
            return self._large(gpu_of(payload), nbytes).put(payload)
        except ChannelFull as exc:
            return _overflow(exc).put(payload)

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        nbytes, _ = payload_spec(like)
        if nbytes <= self.inline_max_bytes:
            return self.small.reserve(like, device)
        try:
            return self._large(device, nbytes).reserve(like, device)
        except ChannelFull as exc:
            return _overflow(exc).reserve(like, device)

    def spans_hosts(self) -> bool:
        """Whether the cluster runs on more than one host: checked once a minute, and every
        second while some node has not yet said which host it is on (until then: yes)."""
        if time.monotonic() - self._checked > self._ttl:
            verdict = cluster_is_one_host()
            self._local, self._checked = verdict is True, time.monotonic()
            self._ttl = LOCALITY_TTL_S if verdict is not None else UNSETTLED_TTL_S
        return not self._local

    def _large(self, device: torch.device | None = None, nbytes: int = 0) -> Channel:
        if self.large is not None:
            return self.large
        on_gpu = device is not None and device.type == "cuda" and self.gpu_consumer
        if on_gpu and nbytes >= GPU_DIRECT_MIN_BYTES and nixl_available():
            return DirectChannel()
        if not self.spans_hosts():
            return _BACKENDS["shared_memory"]()
        if nixl_available():
            return SharedMemoryDirectChannel()
        return _BACKENDS["object_store"]()

    async def get(self, ref: TensorRef) -> Payload:
        return await backend_for(ref).get(ref)

    def free(self, ref: TensorRef) -> None:
        backend_for(ref).free(ref)

    def abandon(self, ref: TensorRef) -> None:
        backend_for(ref).abandon(ref)


_overflowed = False


def _overflow(full: ChannelFull) -> Channel:
    """Where a payload goes when the backend auto picked is full: the object store, which any
    replica reads (slower, but the request is answered). Said once per process. Not from a
    process outside Ray (vLLM's engine core, exporting KV blocks), where ``ray.put`` would start
    a Ray instance of its own: there ``full`` is raised."""
    if not ray_is_running():
        raise full
    global _overflowed
    counts.record_overflow()
    if not _overflowed:
        _overflowed = True
        logger.warning("%s; until then payloads that do not fit go through the object store", full)
    return _BACKENDS["object_store"]()


def backend_for(ref: TensorRef) -> Channel:
    try:
        return _BACKENDS[ref.backend]()
    except KeyError:
        raise ChannelError(f"unknown channel backend {ref.backend!r}") from None


async def take(ref: TensorRef) -> Payload:
    """Read a ref's tensors and free it: the consumer of a one-reader edge owns the ref."""
    announce()
    channel = backend_for(ref)
    start = time.perf_counter()
    try:
        payload = await channel.get(ref)
    except ChannelError:
        counts.record_failed_take(ref.backend)
        raise
    finally:
        channel.free(ref)
    counts.record_take(ref.backend, ref.nbytes, time.perf_counter() - start)
    return payload


def release(*refs: TensorRef | None) -> None:
    """Caller side, once a call carrying ``refs`` has ended in any way (refused, failed,
    cancelled, or done): frees those no consumer read (the call never ran, was cancelled while
    queued, or failed before reading them); those a consumer read are its to hand back."""
    for ref in refs:
        if ref is not None:
            backend_for(ref).abandon(ref)


def close() -> None:
    """Unlink this process's shared-memory segments now; for a stage replica that Serve stops.
    Serve ends a stopped replica without running exit handlers, so its pool (up to
    ``OMNI_SHM_POOL_BYTES`` of memory) would stay in /dev/shm until another producer on the
    host next sweeps dead producers' segments. Payloads readers have mapped stay readable;
    refs not yet read are freed, as if the producer had died."""
    unlink_pool()


def channel_stats() -> dict[str, Any]:
    """This process's channel counters (``stats.ChannelStats``) and the bytes its
    shared-memory pool holds (``pool_bytes``): a stage's ``stats()["channel"]``."""
    return {**counts.as_dict(), "pool_bytes": pool_bytes()}


def make_channel(
    backend: str = "auto", inline_max_bytes: int = 64 * 1024, gpu_consumer: bool = True
) -> Channel:
    """The channel an edge's ``ChannelSettings`` ask for. ``gpu_consumer``: the consuming
    stage has a GPU, so a payload on a GPU may stay there (direct backend: read GPU to GPU);
    else it goes through host memory on every backend (a reader without CUDA cannot read
    GPU memory over UCX). Also records this node's host id, so producers elsewhere see
    whether this process can map their shared memory before it reads anything."""
    announce()
    if backend == "auto":
        return AutoChannel(inline_max_bytes, gpu_consumer=gpu_consumer)
    if backend not in _BACKENDS:
        raise ValueError(f"channel backend {backend!r} is not available")
    if backend in ("direct", "shared_memory_direct") and not nixl_available():
        raise ValueError(
            f"channel backend {backend!r} needs NIXL: pip install 'nixl-cu12==1.5.1' "
            "(the project's [direct] extra)"
        )
    if backend == "direct":
        return DirectChannel(gpu_consumer=gpu_consumer)
    return _BACKENDS[backend]()
