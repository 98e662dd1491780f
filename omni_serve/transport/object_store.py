"""Object-store backend: ``ray.put`` once, any node can read; the portable fallback.

Tensors are stored as their raw bytes in numpy arrays (with RAY_ENABLE_ZERO_COPY_TORCH_TENSORS
unset Ray pickles torch tensors, ~0.3 GB/s; numpy buffers go through zero-copy), which also
carries the dtypes numpy lacks (bf16, fp8, complex32). Ray's distributed refcount frees the
object once no ref holds it; ``free`` drops ours.
"""

from __future__ import annotations

import uuid

import torch

from omni_serve.transport.base import (
    ChannelError,
    Payload,
    Reservation,
    TensorRef,
    as_bytes,
    from_parts,
    named_tensors,
    payload_spec,
    reservation_to_put,
)


class ObjectStoreChannel:
    name = "object_store"

    def put(self, payload: Payload) -> TensorRef:
        import ray

        nbytes, spec = payload_spec(payload)
        tensors, keys = named_tensors(payload)
        handle = (ray.put({name: as_bytes(t.cpu()).numpy() for name, t in tensors.items()}), keys)
        return TensorRef(self.name, uuid.uuid4().hex, nbytes, spec, handle=handle)

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        return reservation_to_put(self, like, device)

    async def get(self, ref: TensorRef) -> Payload:
        if ref.handle is None:
            raise ChannelError(f"ref {ref.key} was freed")
        object_ref, keys = ref.handle
        arrays = await object_ref
        # store buffers are read-only: copied out
        return from_parts({n: torch.from_numpy(a.copy()) for n, a in arrays.items()}, ref, keys)

    def free(self, ref: TensorRef) -> None:
        ref.handle = None

    def abandon(self, ref: TensorRef) -> None:
        # Ray's refcount frees the object once neither side holds an ObjectRef to it.
        ref.handle = None
