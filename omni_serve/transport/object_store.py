"""Object-store backend: ``ray.put`` once, any node can read; the portable fallback.

Torch tensors are stored as numpy arrays (with RAY_ENABLE_ZERO_COPY_TORCH_TENSORS unset Ray
pickles torch tensors, ~0.3 GB/s; numpy buffers go through zero-copy); bf16 goes as its raw
bits. Ray's distributed refcount frees the object once no ref holds it; ``free`` drops ours.
"""

from __future__ import annotations

import uuid
from typing import Any

import torch

from omni_serve.transport.base import (
    ChannelError,
    Payload,
    Reservation,
    TensorRef,
    payload_spec,
    reservation_to_put,
)


def _to_numpy(t: torch.Tensor) -> tuple[Any, str]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def _from_numpy(array: Any, dtype: str) -> torch.Tensor:
    tensor = torch.from_numpy(array.copy())  # store buffers are read-only
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


class ObjectStoreChannel:
    name = "object_store"

    def put(self, payload: Payload) -> TensorRef:
        import ray

        nbytes, spec = payload_spec(payload)
        is_dict = isinstance(payload, dict)
        tensors = payload if is_dict else {"": payload}
        encoded = {k: _to_numpy(t) for k, t in tensors.items()}
        handle = (ray.put(encoded), is_dict)
        return TensorRef(self.name, uuid.uuid4().hex, nbytes, spec, handle=handle)

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        return reservation_to_put(self, like, device)

    async def get(self, ref: TensorRef) -> Payload:
        if ref.handle is None:
            raise ChannelError(f"ref {ref.key} was freed")
        object_ref, is_dict = ref.handle
        encoded = await object_ref
        tensors = {k: _from_numpy(a, dtype) for k, (a, dtype) in encoded.items()}
        return tensors if is_dict else tensors[""]

    def free(self, ref: TensorRef) -> None:
        ref.handle = None

    def abandon(self, ref: TensorRef) -> None:
        # Ray's refcount frees the object once neither side holds an ObjectRef to it.
        ref.handle = None
