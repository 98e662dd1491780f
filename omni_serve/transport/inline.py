"""Inline backend: small payloads ride the handle call itself (a copy is cheaper than a hop)."""

from __future__ import annotations

import uuid

from omni_serve.transport.base import ChannelError, Payload, TensorRef, payload_spec


class InlineChannel:
    name = "inline"

    def put(self, payload: Payload) -> TensorRef:
        nbytes, spec = payload_spec(payload)
        return TensorRef(self.name, uuid.uuid4().hex, nbytes, spec, handle=payload)

    async def get(self, ref: TensorRef) -> Payload:
        if ref.handle is None:
            raise ChannelError(f"ref {ref.key} was freed")
        return ref.handle

    def free(self, ref: TensorRef) -> None:
        ref.handle = None  # idempotent: a second free is a no-op

    def abandon(self, ref: TensorRef) -> None:
        ref.handle = None  # the caller's copy; the consumer's (pickled) copy is its own
