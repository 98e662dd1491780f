from __future__ import annotations

import torch

from omni_serve.kv_store.block_pool import BlockPool, engine_block_keys
from omni_serve.kv_store.kept_prefix import PrefixFacts
from tests.omni_serve.kv_store.conftest import BLOCK, kept, kv_blocks

SYSTEM = list(range(100, 116))  # 4 blocks of 4


def _facts(tokens: list[int], mm_ids=("img",), mm_offsets=(1,), layout="NHD") -> PrefixFacts:
    return PrefixFacts(tokens, BLOCK, list(mm_ids), list(mm_offsets), layout)


def test_block_keys_follow_the_tokens_and_media_before_each_block():
    keys = engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4]), "ns")
    same_start = engine_block_keys(_facts([*SYSTEM, 9, 9, 9, 9]), "ns")
    assert len(keys) == 5 and keys[:4] == same_start[:4] and keys[4] != same_start[4]
    other_image = engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4], mm_ids=("other",)), "ns")
    assert not set(keys) & set(other_image)  # the image is in block 0: every block differs
    at_9 = engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4], mm_offsets=(9,)), "ns")
    at_10 = engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4], mm_offsets=(10,)), "ns")
    assert at_9[:2] == at_10[:2] and at_9[2] != at_10[2]  # the image starts in block 2
    for other in (
        engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4]), "another-model"),
        engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4], layout="HND"), "ns"),
    ):
        assert not set(keys) & set(other)
    unplaced = engine_block_keys(_facts([*SYSTEM, 1, 2, 3, 4], mm_offsets=()), "ns")
    unplaced_other = _facts([*SYSTEM, 1, 2, 3, 4], mm_ids=("other",), mm_offsets=())
    assert not set(unplaced) & set(engine_block_keys(unplaced_other, "ns"))


def test_prefixes_that_begin_alike_hold_their_shared_blocks_once():
    a, b = kept([*SYSTEM, 1, 2, 3, 4], seed=1), kept([*SYSTEM, 5, 6, 7, 8], seed=2)
    b.kv = {name: t.clone() for name, t in b.kv.items()}
    for name in b.kv:  # the same system prompt computes the same KV
        b.kv[name][:4] = a.kv[name][:4]
    keys_a, keys_b = engine_block_keys(a.facts, "ns"), engine_block_keys(b.facts, "ns")
    one_block = sum(t[0].numel() * t.element_size() for t in a.kv.values())
    pool = BlockPool()
    assert pool.new_bytes(keys_a, a.kv) == 5 * one_block
    pool.hold(keys_a, a.kv)
    assert pool.new_bytes(keys_b, b.kv) == one_block  # only its last block is new
    pool.hold(keys_b, b.kv)
    assert pool.nbytes == 6 * one_block and len(pool) == 6
    for keys, prefix in ((keys_a, a), (keys_b, b)):
        gathered = pool.gather(keys)
        for name, t in prefix.kv.items():
            assert torch.equal(gathered[name], t)
    pool.release(keys_a)
    assert pool.nbytes == 5 * one_block  # the shared blocks stay for b
    assert torch.equal(pool.gather(keys_b)["layers.0.attn"], b.kv["layers.0.attn"])
    pool.release(keys_b)
    assert pool.nbytes == 0 and len(pool) == 0


def test_a_held_block_is_a_copy_not_a_view_of_the_callers_tensor():
    kv = kv_blocks(8, 0)
    keys = engine_block_keys(_facts(list(range(8))), "ns")
    pool = BlockPool()
    pool.hold(keys, kv)
    before = pool.gather(keys)["layers.0.attn"].clone()
    kv["layers.0.attn"].zero_()
    assert torch.equal(pool.gather(keys)["layers.0.attn"], before)
