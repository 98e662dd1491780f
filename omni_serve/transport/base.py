"""The tensor channel contract: heavy tensors move beside the handle call, not inside it.

``put`` returns a small picklable ``TensorRef``; only the ref rides a DeploymentHandle call;
the consumer ``get``s the tensors back and ``free``s the ref when done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Payload = torch.Tensor | dict[Any, torch.Tensor]


class ChannelError(RuntimeError):
    """A ref that cannot be read (freed, lost, or from an unknown backend)."""


@dataclass
class TensorRef:
    backend: str
    key: str
    nbytes: int
    # dtype/shape per tensor, for logs and for consumers that preallocate.
    spec: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    handle: Any = None  # backend-specific (the payload itself for inline, an ObjectRef, ...)


class Channel(Protocol):
    name: str

    def put(self, payload: Payload) -> TensorRef: ...

    async def get(self, ref: TensorRef) -> Payload: ...

    def free(self, ref: TensorRef) -> None: ...

    def abandon(self, ref: TensorRef) -> None:
        """Caller side, after the call carrying ``ref`` failed or was cancelled: free it if
        no consumer read it; never disturbs one that did."""
        ...


def payload_spec(payload: Payload) -> tuple[int, dict[str, tuple[str, tuple[int, ...]]]]:
    tensors = payload if isinstance(payload, dict) else {"": payload}
    spec = {str(k): (str(t.dtype), tuple(t.shape)) for k, t in tensors.items()}
    return sum(t.numel() * t.element_size() for t in tensors.values()), spec
