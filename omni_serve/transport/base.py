"""The tensor channel contract: heavy tensors move beside the handle call, not inside it.

``put`` returns a small picklable ``TensorRef``; only the ref rides a DeploymentHandle call;
the consumer ``get``s the tensors back and ``free``s the ref when done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from omni_serve.transport.copying import copy_bytes

Payload = torch.Tensor | dict[Any, torch.Tensor]


class ChannelError(RuntimeError):
    """A ref that cannot be read (freed, lost, or from an unknown backend)."""


class ChannelFull(ChannelError):
    """No room for a payload on this backend now (shared memory full): another one may have."""


@dataclass
class TensorRef:
    backend: str
    key: str
    nbytes: int
    # dtype/shape per tensor, for logs and for consumers that preallocate.
    spec: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    handle: Any = None  # backend-specific (the payload itself for inline, an ObjectRef, ...)


@dataclass
class Reservation:
    """Channel memory shaped like a payload, for a producer that can write its payload in place
    (``torch.index_select(..., out=...)`` of KV blocks, say) instead of building it and having
    ``put`` copy it: ``tensors`` to write, then ``commit()`` for the ref, or ``cancel()``.
    Do not write to ``tensors`` after committing: a consumer may be reading them."""

    tensors: Payload
    commit: Callable[[], TensorRef]
    cancel: Callable[[], None]


class Channel(Protocol):
    name: str

    def put(self, payload: Payload) -> TensorRef: ...

    def reserve(self, like: Payload, device: torch.device | None = None) -> Reservation:
        """Memory for a payload shaped like ``like`` (its tensors may be on the "meta" device:
        only dtypes and shapes are read), on ``device`` where the backend can place it."""
        ...

    async def get(self, ref: TensorRef) -> Payload: ...

    def free(self, ref: TensorRef) -> None: ...

    def abandon(self, ref: TensorRef) -> None:
        """Caller side, after the call carrying ``ref`` failed or was cancelled: free it if
        no consumer read it; never disturbs one that did."""
        ...


def payload_spec(payload: Payload) -> tuple[int, dict[str, tuple[str, tuple[int, ...]]]]:
    """Its size in bytes and (dtype, shape) per tensor under string keys. Raises TypeError for
    what no backend carries as bytes: anything but a tensor or a flat dict of tensors, sparse
    and quantized tensors (moving those as raw bytes fails, or crashes the process), and keys
    that collide as strings (one tensor would silently stand in for the other)."""
    if not isinstance(payload, torch.Tensor | dict):
        raise TypeError(
            f"a channel payload is a tensor or a dict of tensors, not a {type(payload).__name__}"
        )
    tensors = payload if isinstance(payload, dict) else {"": payload}
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"payload[{key!r}] is a {type(t).__name__}, not a tensor (payloads "
                "are flat: a dict of tensors)"
            )
        if t.layout != torch.strided or t.is_quantized:
            kind = "quantized" if t.is_quantized else str(t.layout).removeprefix("torch.")
            raise TypeError(
                f"payload[{key!r}] is a {kind} tensor: send it dense (its values "
                "and indices, or scales, as tensors of their own)"
            )
    spec = {str(k): (str(t.dtype), tuple(t.shape)) for k, t in tensors.items()}
    if len(spec) != len(tensors):
        raise TypeError(f"payload keys {list(tensors)} collide as strings")
    return sum(t.numel() * t.element_size() for t in tensors.values()), spec


def reservation_to_put(
    channel: Channel, like: Payload, device: torch.device | None = None
) -> Reservation:
    """For backends with no memory of their own to hand out (inline, object store): plain
    tensors, ``put`` on commit."""

    def empty(t: torch.Tensor) -> torch.Tensor:
        place = device or (torch.device("cpu") if t.is_meta else t.device)
        return torch.empty(t.shape, dtype=t.dtype, device=place)

    tensors = {k: empty(t) for k, t in like.items()} if isinstance(like, dict) else empty(like)
    return Reservation(tensors, lambda: channel.put(tensors), lambda: None)


def put_in_place(
    channel: Channel,
    like: Payload,
    fill: Callable[[Payload], None],
    device: torch.device | None = None,
) -> TensorRef:
    """``fill`` writes the payload into reserved channel memory; its ref (the memory goes back
    if ``fill`` fails)."""
    reservation = channel.reserve(like, device)
    try:
        fill(reservation.tensors)
    except BaseException:
        reservation.cancel()
        raise
    return reservation.commit()


def cat_into(out: torch.Tensor, parts: list[torch.Tensor], dim: int = 0) -> None:
    """``torch.cat(parts, dim)`` written into ``out`` (reserved channel memory, say), cut at
    ``out``'s size along ``dim``: each part is cast and moved once, with no concatenated copy
    in between."""
    start, size = 0, out.shape[dim]
    for part in parts:
        count = min(part.shape[dim], size - start)
        if count <= 0:
            break
        out.narrow(dim, start, count).copy_(part.narrow(dim, 0, count))
        start += count


ALIGN = 64  # bytes; every tensor (and the data after a header) starts on a cache line


def gpu_of(payload: Payload) -> torch.device | None:
    """The GPU the payload's first GPU tensor is on (None: all on the host; what is not a
    tensor is left to ``payload_spec`` to refuse)."""
    tensors = payload.values() if isinstance(payload, dict) else (payload,)
    on_gpu = (t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda)
    return next(on_gpu, None)


def on_host(payload: Payload) -> Payload:
    """The payload with its GPU tensors copied to host memory: what every backend but direct
    carries (a consumer may have no GPU, or another one)."""
    if gpu_of(payload) is None:
        return payload
    if isinstance(payload, dict):
        return {k: t.cpu() for k, t in payload.items()}
    return payload.cpu()


def named_tensors(payload: Payload) -> tuple[dict[str, torch.Tensor], list[Any] | None]:
    """The payload's tensors under string keys, and its own keys (None: a bare tensor)."""
    if isinstance(payload, dict):
        return {str(k): t for k, t in payload.items()}, list(payload)
    return {"": payload}, None


def layout(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, tuple[int, int]], int]:
    """(offset, nbytes) per tensor in one flat buffer, after an ALIGN-byte header; its size."""
    offsets, end = {}, ALIGN
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        offsets[key] = (end, nbytes)
        end += -(-nbytes // ALIGN) * ALIGN
    return offsets, end


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, flat uint8 (a view where it is contiguous): how every backend moves a
    tensor, whatever its dtype."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def from_bytes(raw: torch.Tensor, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor ``as_bytes`` gave ``raw`` for, viewing it."""
    dt = getattr(torch, dtype.removeprefix("torch."))
    if raw.numel() == 0:  # an empty buffer may have stride 0, which no view takes
        return torch.empty(shape, dtype=dt, device=raw.device)
    return raw.view(dt).reshape(shape)


def pack(
    tensors: dict[str, torch.Tensor], offsets: dict[str, tuple[int, int]], buffer: torch.Tensor
) -> None:
    """Copy the tensors' bytes into ``buffer`` (uint8) at their offsets (``copy_`` moves them
    across devices where the buffer lives elsewhere)."""
    for key, t in tensors.items():
        start, length = offsets[key]
        if length:
            copy_bytes(buffer[start : start + length], as_bytes(t))


def unpack(
    raw: torch.Tensor, ref: TensorRef, offsets: dict[str, tuple[int, int]], keys: list[Any] | None
) -> Payload:
    """The payload as tensors that VIEW ``raw`` (uint8), laid out by ``layout``."""
    parts = {name: raw[start : start + length] for name, (start, length) in offsets.items()}
    return from_parts(parts, ref, keys)


def from_parts(parts: dict[str, torch.Tensor], ref: TensorRef, keys: list[Any] | None) -> Payload:
    """The payload from each tensor's bytes (under ``named_tensors``' string keys)."""
    tensors = {name: from_bytes(parts[name], *ref.spec[name]) for name in ref.spec}
    if keys is None:
        return tensors[""]
    return {k: tensors[str(k)] for k in keys}
