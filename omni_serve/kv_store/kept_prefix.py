"""A kept prefix in the store's own hands: its KV blocks and companion rows as tensors, what
the engine needs to check them (``KVPrefix``'s fields), and the content key it is found by.

Kept as tensors rather than as the exporting engine's channel ref, so that any number of
turns can load it (a ref is read once) and so that it can move to disk and back. The tensors
are copies in the store's own memory: a view of the exporter's shared-memory segment would
hold that segment (part of the Thinker's bounded transport pool) for as long as the prefix
stays kept, so the channel would run short while the store is well within its budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omni_serve.kv_store.content_key import PromptContent
from omni_serve.transport import Channel, take
from omni_serve.transport.kv_blocks import KVPrefix


@dataclass
class PrefixFacts:
    """Everything about a kept prefix but its tensors (JSON-able: a disk page's header)."""

    token_ids: list[int]
    block_size: int
    mm_ids: list[str] = field(default_factory=list)
    mm_offsets: list[int] = field(default_factory=list)
    layout: str = ""
    companion_meta: dict[str, Any] = field(default_factory=dict)
    content: PromptContent = field(default_factory=lambda: PromptContent([]))
    session_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["content"] = {
            "token_ids": self.content.token_ids,
            "media": [list(m) for m in self.content.media],
        }
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> PrefixFacts:
        content = data.pop("content")
        media = [(int(o), str(d)) for o, d in content["media"]]
        return PrefixFacts(**data, content=PromptContent(list(content["token_ids"]), media))


@dataclass
class KeptPrefix:
    facts: PrefixFacts
    kv: dict[str, torch.Tensor]  # layer -> its blocks, block dimension first
    companion: torch.Tensor | None = None  # the Thinker's rows at media positions

    @property
    def nbytes(self) -> int:
        tensors = [*self.kv.values()] + ([self.companion] if self.companion is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    @staticmethod
    async def from_channel(
        encoded: KVPrefix, content: PromptContent, session_id: str | None
    ) -> KeptPrefix:
        """Takes the prefix's refs into the store's own memory (raises ``ChannelError`` for
        one that is gone); the exporter's buffers are free when this returns."""
        taken = await take(encoded.ref)
        if not isinstance(taken, dict):
            raise ValueError("a KV prefix's blocks are a dict of layers")
        kv = {name: blocks.clone() for name, blocks in taken.items()}
        del taken  # the last view of the exporter's segment: its finalizer frees it
        companion = None
        if encoded.companion is not None:
            companion = (await take(encoded.companion)).clone()
        facts = PrefixFacts(
            token_ids=list(encoded.token_ids),
            block_size=encoded.block_size,
            mm_ids=list(encoded.mm_ids),
            mm_offsets=list(encoded.mm_offsets),
            layout=encoded.layout,
            companion_meta=dict(encoded.companion_meta) if companion is not None else {},
            content=content,
            session_id=session_id,
        )
        return KeptPrefix(facts, kv, companion)

    def to_channel(self, channel: Channel) -> KVPrefix:
        """A fresh copy on ``channel`` for one engine to load (this one stays kept)."""
        facts = self.facts
        ref = channel.put(dict(self.kv))
        companion = channel.put(self.companion) if self.companion is not None else None
        return KVPrefix(
            facts.token_ids,
            facts.block_size,
            ref,
            facts.mm_ids,
            facts.layout,
            companion,
            dict(facts.companion_meta) if companion is not None else {},
            facts.mm_offsets,
        )
