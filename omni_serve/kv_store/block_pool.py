"""The host tier's KV blocks, each held once however many kept prefixes begin with it.

A voice agent's callers share its system prompt: kept as whole prefixes, memory would hold
that prompt's KV once per caller. Each engine block is keyed instead by the chain hash of
everything up to its end (``engine_block_keys``: the engine's token ids and media identities,
seeded with the model namespace, the KV layout and the block size), so equal keys mean the
same tokens and media in the same places before it, and so the same KV (as the engine's own
prefix cache assumes). A block lives while any kept prefix refers to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_serve.kv_store.content_key import PromptContent, block_hashes
from omni_serve.kv_store.kept_prefix import PrefixFacts


def engine_block_keys(facts: PrefixFacts, namespace: str) -> list[str]:
    """One key per engine block of the prefix, by its content up to the block's end."""
    seed = f"{namespace}/{facts.layout}/{facts.block_size}"
    if len(facts.mm_offsets) == len(facts.mm_ids):
        media = list(zip(facts.mm_offsets, facts.mm_ids, strict=True))
    else:  # media not placed: its identities key every block (shared only with the same media)
        media, seed = [], f"{seed}/{'/'.join(facts.mm_ids)}"
    content = PromptContent(list(facts.token_ids), media)
    return block_hashes(content, facts.block_size, seed)


@dataclass
class _Block:
    kv: dict[str, torch.Tensor]  # layer -> this block's KV
    nbytes: int
    refs: int = 0


class BlockPool:
    def __init__(self) -> None:
        self.nbytes = 0
        self._blocks: dict[str, _Block] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def new_bytes(self, keys: list[str], kv: dict[str, torch.Tensor]) -> int:
        """The bytes holding ``kv``'s blocks would add (those not held yet)."""
        per_block = sum(t[0].numel() * t.element_size() for t in kv.values()) if keys else 0
        return per_block * sum(1 for key in set(keys) if key not in self._blocks)

    def hold(self, keys: list[str], kv: dict[str, torch.Tensor]) -> None:
        """Refers to ``kv``'s blocks (``kv``: layer -> [blocks, ...], one block per key),
        copying in those not held yet."""
        for i, key in enumerate(keys):
            block = self._blocks.get(key)
            if block is None:
                copies = {name: blocks[i].clone() for name, blocks in kv.items()}
                nbytes = sum(t.numel() * t.element_size() for t in copies.values())
                block = self._blocks[key] = _Block(copies, nbytes)
                self.nbytes += nbytes
            block.refs += 1

    def release(self, keys: list[str]) -> None:
        for key in keys:
            block = self._blocks[key]
            block.refs -= 1
            if not block.refs:
                del self._blocks[key]
                self.nbytes -= block.nbytes

    def gather(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The blocks as the engine takes them: layer -> [blocks, ...] (a fresh copy)."""
        layers = self._blocks[keys[0]].kv.keys()
        return {name: torch.stack([self._blocks[k].kv[name] for k in keys]) for name in layers}
