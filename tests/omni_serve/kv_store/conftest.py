from __future__ import annotations

import pytest
import torch

from omni_serve.kv_store.content_key import PromptContent
from omni_serve.kv_store.kept_prefix import KeptPrefix, PrefixFacts
from omni_serve.transport import make_channel
from omni_serve.transport.kv_blocks import KVPrefix

BLOCK = 4  # the engine's block size in these tests


def kv_blocks(tokens: int, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Two layers of [blocks, 2, heads, block, head_dim] blocks with values from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    shape = (tokens // BLOCK, 2, 1, BLOCK, 8)
    return {f"layers.{i}.attn": torch.randn(shape, generator=g).to(dtype) for i in range(2)}


def kept(tokens: list[int], seed: int = 0, session: str = "s", companion: bool = False):
    facts = PrefixFacts(
        token_ids=tokens,
        block_size=BLOCK,
        mm_ids=["img"],
        mm_offsets=[1],
        layout="NHD",
        companion_meta={"ids": tokens[:3]} if companion else {},
        content=PromptContent(tokens, [(1, "img")]),
        session_id=session,
    )
    rows = torch.arange(6, dtype=torch.float32).reshape(3, 2) if companion else None
    return KeptPrefix(facts, kv_blocks(len(tokens), seed), rows)


@pytest.fixture
def channel():
    return make_channel("inline", 1 << 30)


def exported(channel, tokens: list[int], seed: int = 0, mm=("img", 1)) -> str:
    """A Thinker's export of ``tokens``' blocks, encoded as it rides the turn's last chunk."""
    ref = channel.put(kv_blocks(len(tokens), seed))
    return KVPrefix(tokens, BLOCK, ref, [mm[0]], "NHD", mm_offsets=[mm[1]]).encode()


def shared_blocks(ours: list[str], theirs: list[str]) -> int:
    """How many leading blocks two chains share (equal hashes at a depth: equal up to it)."""
    n = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        n += 1
    return n
