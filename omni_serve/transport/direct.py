"""Direct backend: the consumer reads the producer's memory itself, through NIXL (UCX).

For edges the other backends serve badly: across hosts (shared memory cannot, the object store
copies through two stores) and between GPUs (every other path goes device -> host -> device).
UCX picks the wire: shared memory or CMA on one host, TCP or RDMA across hosts, CUDA IPC or
GPUDirect between GPUs. Only a ref (agent metadata, address, generation: ~0.5 KB) rides the
handle call.

Unlike shared memory, a ref taken once cannot be read again by a retried call (the first
reader's free released it).

The agent, its buffers and its reads are ``direct_endpoint.py``.
"""

from __future__ import annotations

import asyncio

import torch

from omni_serve.transport.base import (
    ChannelError,
    Payload,
    Reservation,
    TensorRef,
    gpu_of,
    layout,
    named_tensors,
    pack,
    payload_spec,
    unpack,
)
from omni_serve.transport.direct_buffers import (
    Buffer,
    Where,
)
from omni_serve.transport.direct_endpoint import endpoint


def _consumer_device(where: Where) -> torch.device:
    """GPU to GPU when the payload is on a GPU (the point of this backend); host memory else."""
    if where.mem_type == "VRAM":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _written(ref: TensorRef) -> TensorRef:
    """``ref`` once its bytes are in the buffer. GPU copies (and a reservation's writes) are
    only queued on the device when ``put`` returns, behind whatever the producer queued before
    (a model's forward, say), and a reader on another process reads the memory with no regard
    for this process's streams: so wait for this device's queued work first."""
    where: Where = ref.handle
    if where.mem_type == "VRAM":
        torch.cuda.synchronize(where.device_id)
    return ref


class DirectChannel:
    """``gpu_consumer``: the consumer has a GPU, so payloads on a GPU stay there (registered
    GPU buffers, read GPU to GPU); without one they go to host buffers, since a reader whose
    UCX has no CUDA support cannot read GPU memory ("cannot find remote protocol ... from
    cuda", seen on an H100 with CUDA_VISIBLE_DEVICES="" in the reader)."""

    name = "direct"

    def __init__(self, gpu_consumer: bool = True) -> None:
        self.gpu_consumer = gpu_consumer

    def put(self, payload: Payload) -> TensorRef:
        device = gpu_of(payload) if self.gpu_consumer else None
        tensors, offsets, buffer, ref = self._claim(payload, device)
        try:
            pack(tensors, offsets, buffer.memory)
        except BaseException:
            self.free(ref)
            raise
        return _written(ref)

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        """A registered buffer to write into: on ``device`` if it is a GPU (the consumer reads
        it GPU to GPU), else in host memory."""
        _, offsets, buffer, ref = self._claim(like, device if self.gpu_consumer else None)
        views = unpack(buffer.memory, ref, offsets, ref.handle.keys)
        return Reservation(views, lambda: _written(ref), lambda: self.free(ref))

    def _claim(
        self, payload: Payload, device: torch.device | None
    ) -> tuple[dict[str, torch.Tensor], dict, Buffer, TensorRef]:
        """A buffer for ``payload``, in use from now on, and the ref that will name it."""
        nbytes, spec = payload_spec(payload)
        tensors, keys = named_tensors(payload)
        if device is None or device.type != "cuda":
            device = torch.device("cpu")
        elif device.index is None:  # "cuda": buffers are found again by their exact device
            device = torch.device("cuda", torch.cuda.current_device())
        offsets, needed = layout(tensors)
        owner = endpoint()
        buffer = owner.acquire(needed, device)
        where = owner.where(buffer.index, buffer.memory, buffer.generation, needed, offsets, keys)
        ref = TensorRef(self.name, f"{owner.name}/{buffer.index}", nbytes, spec, handle=where)
        return tensors, offsets, buffer, ref

    async def get(self, ref: TensorRef) -> Payload:
        where: Where = ref.handle
        if where.mem_type == "VRAM" and not torch.cuda.is_available():
            raise ChannelError(
                f"direct ref {ref.key} is in GPU memory and this process has no GPU: the "
                "producer's channel must be made with gpu_consumer=False for this edge"
            )
        memory = await asyncio.to_thread(endpoint().read, where, _consumer_device(where))
        return unpack(memory, ref, where.offsets, where.keys)

    def free(self, ref: TensorRef) -> None:
        endpoint().hand_back(ref.handle)

    def abandon(self, ref: TensorRef) -> None:
        """The consumer got a copy, so the owner may reuse the buffer whether or not it was
        read; a read still under way fails with "freed" (its call has ended anyway)."""
        endpoint().hand_back(ref.handle)
