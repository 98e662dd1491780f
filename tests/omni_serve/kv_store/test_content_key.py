from __future__ import annotations

import numpy as np
import torch

from omni_serve.kv_store.content_key import PromptContent, block_hashes, media_digest
from tests.omni_serve.kv_store.conftest import shared_blocks

IDS = list(range(100, 120))  # 5 blocks of 4


def test_equal_prompts_have_equal_chains_and_a_partial_block_has_no_hash():
    ours = block_hashes(PromptContent(IDS), 4, "ns")
    assert ours == block_hashes(PromptContent([*IDS, 7, 8]), 4, "ns")[:5]
    assert len(ours) == 5 and len(block_hashes(PromptContent(IDS[:7]), 4, "ns")) == 1


def test_a_differing_token_changes_its_block_and_every_later_one():
    other = [*IDS]
    other[9] = 1  # block 2
    assert (
        shared_blocks(
            block_hashes(PromptContent(IDS), 4, "ns"), block_hashes(PromptContent(other), 4, "ns")
        )
        == 2
    )


def test_another_image_at_the_same_place_differs_from_its_block_on():
    a = block_hashes(PromptContent(IDS, [(6, "img-a")]), 4, "ns")
    b = block_hashes(PromptContent(IDS, [(6, "img-b")]), 4, "ns")
    assert shared_blocks(a, b) == 1  # the image starts in block 1
    moved = block_hashes(PromptContent(IDS, [(9, "img-a")]), 4, "ns")
    assert shared_blocks(a, moved) == 1  # the same image elsewhere is another prompt


def test_another_namespace_shares_nothing():
    assert (
        shared_blocks(
            block_hashes(PromptContent(IDS), 4, "model-a"),
            block_hashes(PromptContent(IDS), 4, "model-b"),
        )
        == 0
    )


def test_media_digests_tell_content_dtype_and_shape_apart():
    pixels = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert media_digest(pixels) == media_digest(torch.from_numpy(pixels.copy()))
    assert media_digest(pixels) != media_digest(pixels.reshape(4, 3))
    assert media_digest(pixels) != media_digest(pixels.astype(np.int16))
    assert media_digest(b"abc") != media_digest(b"abd")
