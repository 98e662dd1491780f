"""Inline backend: small payloads ride the handle call itself (a copy is cheaper than a hop)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from omni_serve.transport.base import (
    ChannelError,
    Payload,
    Reservation,
    TensorRef,
    on_host,
    payload_spec,
    reservation_to_put,
)

if TYPE_CHECKING:
    import torch


class InlineChannel:
    name = "inline"

    def put(self, payload: Payload) -> TensorRef:
        nbytes, spec = payload_spec(payload)
        return TensorRef(self.name, uuid.uuid4().hex, nbytes, spec, handle=on_host(payload))

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        return reservation_to_put(self, like, device)

    async def get(self, ref: TensorRef) -> Payload:
        if ref.handle is None:
            raise ChannelError(f"ref {ref.key} was freed")
        return ref.handle

    def free(self, ref: TensorRef) -> None:
        ref.handle = None  # idempotent: a second free is a no-op

    def abandon(self, ref: TensorRef) -> None:
        ref.handle = None  # the caller's copy; the consumer's (pickled) copy is its own
