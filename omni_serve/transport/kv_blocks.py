"""Paged KV-cache blocks as a channel payload: one token prefix's blocks, layer-major.

What one AR engine hands another so that the second skips that prefix's prefill (a multi-turn
session routed to another replica), or what an AR stage hands a stage that attends to its KV.
The descriptor (``KVPrefix``: token ids, block size, multimodal item ids, the channel ref) is
small and rides the request; the blocks ride the tensor channel. Works on any paged cache
whose per-layer tensor has one dimension of ``num_blocks`` (vLLM's CPU and GPU layouts alike):
blocks are gathered along it and scattered back along the receiver's.
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from omni_serve.transport.base import Channel, TensorRef, put_in_place

if TYPE_CHECKING:
    from omni_serve.transport import AutoChannel

# Keys of vLLM's per-request kv_transfer_params (omni_serve.engines.ar.kv_connector).
EXPORT_KEY = "omni_kv_export"  # in: put this prompt's whole blocks on the channel
PREFIX_KEY = "omni_kv"  # in: load this encoded KVPrefix; out: the exported one
# in, for a prompt given as embeddings (vLLM has no token ids for it): its token ids, and
# [(offset, identity)] of the media items spliced into it, to match prefixes on
PROMPT_KEY = "omni_kv_prompt"
MEDIA_KEY = "omni_kv_media"
# in, with EXPORT_KEY: the backend to put this export on, named by a process that sees the
# cluster (the engine's own process is no Ray worker: see ``export_backend``)
CHANNEL_KEY = "omni_kv_channel"


@dataclass
class KVPrefix:
    """A prefix whose KV blocks wait on the channel: the consumer checks that its prompt starts
    with ``token_ids`` (and the same multimodal items) before loading any."""

    token_ids: list[int]
    block_size: int
    ref: TensorRef
    mm_ids: list[str] = field(default_factory=list)
    # How the exporting engine lays K and V out in a block (its attention backend's own
    # format): an engine loads only blocks of its own layout, and a reader of the keys and
    # values themselves picks its unpacking by it. "" = not recorded.
    layout: str = ""
    # What the exporting stage keeps with the blocks for the session's next turn (the
    # Thinker's rows at media positions) and the facts that say what it covers. Engines never
    # read it; it is freed with the prefix (``refs``).
    companion: TensorRef | None = None
    companion_meta: dict = field(default_factory=dict)
    # Where each of ``mm_ids`` starts in ``token_ids`` (empty: not recorded; then any other
    # media refuses the whole prefix, as no block can be told apart).
    mm_offsets: list[int] = field(default_factory=list)

    def refs(self) -> list[TensorRef]:
        """Every buffer this prefix holds."""
        return [self.ref] if self.companion is None else [self.ref, self.companion]

    @property
    def num_blocks(self) -> int:
        return len(self.token_ids) // self.block_size

    def encode(self) -> str:
        """For vLLM's ``kv_transfer_params`` (msgpack between engine processes). Only ever built
        by this process or a peer stage: the API never takes kv_transfer_params from clients."""
        return base64.b64encode(pickle.dumps(self)).decode()

    @staticmethod
    def decode(text: str) -> KVPrefix:
        """Raises ValueError for anything that is not an encoded prefix."""
        try:
            prefix = pickle.loads(base64.b64decode(text))
        except (ValueError, TypeError, EOFError, AttributeError, pickle.UnpicklingError) as exc:
            raise ValueError(f"not an encoded KV prefix: {exc}") from None
        if not isinstance(prefix, KVPrefix):
            raise ValueError(f"not an encoded KV prefix: a {type(prefix).__name__}")
        return prefix

    def matching_tokens(self, prompt: list[int], mm_items: list[tuple[int, str]]) -> int:
        """How many leading tokens of ``prompt`` (whose media items are ``mm_items``: offset,
        identity) these blocks cover: whole blocks, up to the first token or media item that
        differs, and never the prompt's last token, which the engine must compute to sample
        from."""
        limit = min(len(self.token_ids), max(len(prompt) - 1, 0))
        same = 0
        while same < limit and prompt[same] == self.token_ids[same]:
            same += 1
        if len(self.mm_offsets) != len(self.mm_ids):  # where its items sit is unknown
            if [identity for _, identity in mm_items][: len(self.mm_ids)] != self.mm_ids:
                return 0  # same placeholder tokens, different images or audio
            return same // self.block_size * self.block_size
        ours = dict(zip(self.mm_offsets, self.mm_ids, strict=True))
        theirs = dict(mm_items)
        for offset in sorted(set(ours) | set(theirs)):
            if offset >= same:
                break
            if ours.get(offset) != theirs.get(offset):
                same = offset  # the same placeholder tokens, another image or clip from here
                break
        return same // self.block_size * self.block_size


def gather_into(
    out: dict[str, torch.Tensor],
    caches: dict[str, torch.Tensor],
    dims: dict[str, int],
    block_ids: list[int],
) -> None:
    """Write the blocks ``block_ids`` of every layer into ``out[layer]`` (block dimension
    first): straight from the cache where it indexes blocks first and sits on ``out``'s
    device, so exporting copies the blocks once."""
    index = torch.tensor(block_ids, dtype=torch.long)
    for name, cache in caches.items():
        dim, target = dims[name], out[name]
        if dim == 0 and cache.device == target.device:
            torch.index_select(cache, 0, index.to(cache.device), out=target)
        else:
            target.copy_(cache.index_select(dim, index.to(cache.device)).movedim(dim, 0))


def scatter(
    blocks: dict[str, torch.Tensor],
    caches: dict[str, torch.Tensor],
    dims: dict[str, int],
    block_ids: list[int],
    first: int = 0,
) -> None:
    """Write blocks ``first:first + len(block_ids)`` of each layer into ``block_ids``."""
    missing = set(caches) - set(blocks)
    if missing:
        raise ValueError(f"KV blocks lack layers {sorted(missing)[:3]}")
    index = torch.tensor(block_ids, dtype=torch.long)
    for name, cache in caches.items():
        rows = blocks[name][first : first + len(block_ids)].to(cache.device, cache.dtype)
        cache.index_copy_(dims[name], index.to(cache.device), rows.movedim(0, dims[name]))


def put_prefix(
    channel: Channel,
    caches: dict[str, torch.Tensor],
    dims: dict[str, int],
    block_ids: list[int],
    token_ids: list[int],
    block_size: int,
    mm_items: list[tuple[int, str]],
    layout: str = "",
) -> KVPrefix:
    like = {
        name: torch.empty(
            (len(block_ids), *(n for d, n in enumerate(cache.shape) if d != dims[name])),
            dtype=cache.dtype,
            device="meta",
        )
        for name, cache in caches.items()
    }
    devices = {cache.device for cache in caches.values()}
    ref = put_in_place(
        channel,
        like,
        lambda out: gather_into(out, caches, dims, block_ids),
        devices.pop() if len(devices) == 1 else None,
    )
    tokens = list(token_ids[: len(block_ids) * block_size])
    mm_ids = [identity for _, identity in mm_items]
    offsets = [offset for offset, _ in mm_items]
    return KVPrefix(tokens, block_size, ref, mm_ids, layout, mm_offsets=offsets)


def export_backend(edge_channel: Channel | AutoChannel) -> str | None:
    """The backend for a KV export that an engine makes outside Ray (vLLM's engine process),
    named by the stage that owns the engine: ``auto`` there cannot see the cluster's hosts and
    picks shared memory, which a replica on another host cannot read. So, while the cluster
    spans hosts (and NIXL is installed; the object store needs Ray), shared memory that a
    replica on another host reads over NIXL; else None: the engine's own choice (an edge that
    pins a backend has the engine use it already)."""
    from omni_serve.compat.nixl import nixl_available
    from omni_serve.transport import AutoChannel

    if isinstance(edge_channel, AutoChannel) and edge_channel.spans_hosts() and nixl_available():
        return "shared_memory_direct"
    return None
