"""What a Thinker-Talker family's stages send each other over Serve handles.

Plain dataclasses, so that a reader sees every field a stage may get and a type checker follows
them across the handle. Small tensors (grids, lengths) ride as lists: a torch tensor costs
~100 us to pickle and load, a short list a few. Heavy tensors never ride here: only their
channel references do (``TensorRef``).

The items a stage streams (a ``ThinkerChunk`` per token, a ``CodecFrame`` per frame) cross the
handle in their wire form (``to_wire``: a list of plain values, read back by ``from_wire``):
Ray packs plain values with msgpack, but any other object through pickle, which costs a Serve
stream ~0.1 ms more per item (load_tests/bench_stage_messages.py). Requests, one per reply,
cross as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.transport.base import TensorRef

# ``ThinkerChunk.prompt_rows`` of a prompt whose Talker needs no captured rows (Qwen3-Omni's
# without media: the Talker looks the token embeddings up itself).
TOKEN_EMBEDDINGS = "token_embeddings"


class _Message:
    """Pickles as its class and its field values in order: about half the time of a slotted
    dataclass's default state (a dict of field names), and a third of the bytes."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in self.__slots__)


@dataclass(slots=True)
class ShippedMedia(_Message):
    """Media the Thinker encodes itself: the tensors on the channel and how to read them
    back (``media_payload``)."""

    ref: TensorRef
    layout: dict[str, Any]


@dataclass(slots=True)
class ThinkerRequest(_Message):
    """One prompt for the Thinker. ``capture`` asks for the prompt's hidden rows (a spoken
    reply); the media come as one of: ``media`` (raw, the Thinker's processor encodes them),
    ``audio_rows`` (the encoder stage's rows, spliced into an embeddings prompt), or
    ``image_rows``/``video_rows`` with their grids (the encoder stage's rows)."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    capture: bool = False
    session_id: str | None = None  # routing affinity, and the session's KV handover
    session_kv: str | None = None  # the session's last exported KV prefix (encoded)
    cache_key: str | None = None  # routing affinity only
    mm_processor_kwargs: dict[str, Any] | None = None
    media: ShippedMedia | None = None
    audio_rows: TensorRef | None = None
    image_rows: TensorRef | None = None
    image_grid_thw: list[list[int]] | None = None
    video_rows: TensorRef | None = None
    video_grid_thw: list[list[int]] | None = None
    video_second_per_grid: list[float] | None = None


@dataclass(slots=True)
class TakenRows(_Message):
    """Prompt rows already taken off the channel, by layer (never crosses a handle: the Talker
    makes them for itself from the Thinker's, in text to speech)."""

    rows: dict[int, torch.Tensor]


@dataclass(slots=True)
class ThinkerChunk(_Message):  # streamed: ``to_wire`` / ``from_wire`` across a handle
    """A piece of the Thinker's reply. ``prompt_rows`` comes once, on a spoken reply's chunk
    where the prompt's rows are complete (a channel ref, or ``TOKEN_EMBEDDINGS`` for a prompt
    without media); ``session_kv`` on the last chunk of a session's turn."""

    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    stop_tokens: int = 0  # trailing tokens a stop string may still claim (stop_strings.py)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_token_ids: list[int] | None = None  # as the engine ran it (None: the caller's ids)
    # A ref, ``TOKEN_EMBEDDINGS``, or rows already taken (text to speech's).
    prompt_rows: TensorRef | str | TakenRows | None = None
    session_kv: str | None = None
    # Rows of the Thinker's ``reply_layer`` for reply tokens, in order from the first (a family
    # whose Talker reads each reply token's hidden state: Qwen2.5-Omni), ``pack_rows``' form.
    reply_rows: list[Any] | None = None


@dataclass(slots=True)
class SpeakRequest(_Message):
    """One spoken reply: the Talker runs ``thinker`` itself and follows it. ``prompt_ids``:
    the prompt with media placeholders expanded as the Thinker will see them; ``sampling``:
    the caller's Talker sampling overrides; ``reply_ids``: speak these tokens instead of the
    Thinker's reply (text to speech)."""

    request_id: str
    thinker: ThinkerRequest
    prompt_ids: list[int]
    voice: str
    sampling: dict[str, Any]
    image_grid_thw: list[list[int]] | None = None
    video_grid_thw: list[list[int]] | None = None
    video_second_per_grid: list[float] | None = None
    audio_seqlens: list[int] | None = None
    reply_ids: list[int] | None = None


@dataclass(slots=True)
class CodecFrame(_Message):  # streamed: ``to_wire`` / ``from_wire`` across a handle
    """One frame of the Talker's codec codes (one per codebook, as ints)."""

    codes: list[int]


def pack_rows(rows: torch.Tensor) -> list[Any]:
    """[k, H] rows as plain values (raw bytes, shape, dtype): they cross in a streamed item's
    wire form, where a tensor would take the item through pickle."""
    rows = rows.contiguous()
    blob = rows.reshape(-1).view(torch.uint8).numpy().tobytes()
    return [blob, list(rows.shape), str(rows.dtype).removeprefix("torch.")]


def reply_rows(new: torch.Tensor, seen: int, prompt_len: int) -> list[Any] | None:
    """Of a Thinker chunk's ``new`` captured rows, which follow ``seen`` earlier ones, those of
    reply tokens (past the prompt) packed for ``ThinkerChunk.reply_rows``; None if none. A
    chunk's rows may run a token ahead of its tokens (vLLM's worker captured the next step
    already): the Talker indexes them by position, never by chunk."""
    skip = max(prompt_len - seen, 0)
    if new.shape[0] <= skip:
        return None
    return pack_rows(new[skip:])


def unpack_rows(packed: list[Any]) -> torch.Tensor:
    blob, shape, dtype = packed
    return torch.frombuffer(bytearray(blob), dtype=getattr(torch, dtype)).reshape(shape)


SpeakEvent = ThinkerChunk | CodecFrame
_WIRE_TAGS = {ThinkerChunk: "t", CodecFrame: "c"}
_BY_TAG = {tag: cls for cls, tag in _WIRE_TAGS.items()}


def to_wire(item: SpeakEvent) -> list[Any]:
    """A streamed item as plain values: its kind's tag, then its fields in order."""
    return [_WIRE_TAGS[type(item)], *(getattr(item, name) for name in item.__slots__)]


def from_wire(wire: list[Any]) -> SpeakEvent:
    """The item ``to_wire`` made."""
    return _BY_TAG[wire[0]](*wire[1:])


async def decoded(stream: AsyncIterator[list[Any]]) -> AsyncIterator[SpeakEvent]:
    """A handle's stream of wire items as messages. Closing this closes ``stream`` at once:
    a reply its client cancelled stops its stages now, not when ``stream`` is collected."""
    try:
        async for wire in stream:
            yield from_wire(wire)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
