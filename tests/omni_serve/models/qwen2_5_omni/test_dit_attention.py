"""Block-local DiT attention: the same attention as transformers' dense one under its block
mask, and the model handed back as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni_serve.models.qwen2_5_omni.dit_attention import (
    BlockLocalDiTAttention,
    block_local_attention,
    block_local_layers,
)


def dense(q, k, v, block: int, back: int, ahead: int) -> torch.Tensor:
    """What transformers computes: every key, the ones outside the band masked."""
    blocks = torch.arange(q.shape[2]) // block
    diff = blocks[None, :] - blocks[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(diff >= -back) & (diff <= ahead))


@pytest.mark.parametrize("n", [24, 61, 96, 130])
@pytest.mark.parametrize("back,ahead", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_it_equals_dense_attention_under_the_block_mask(n, back, ahead):
    """Whole and ragged last blocks, every band a layer can have."""
    q, k, v = torch.randn(3, 2, 4, n, 16, generator=torch.Generator().manual_seed(n)).unbind(0)
    local = block_local_attention(q, k, v, 24, back, ahead)
    assert local.shape == q.shape
    torch.testing.assert_close(local, dense(q, k, v, 24, back, ahead), rtol=0, atol=1e-5)
    if n > 48:  # a band that counts: with no key outside it, the results would agree anyway
        assert not torch.allclose(local, dense(q, k, v, 24, back + 1, ahead + 1), atol=1e-3)


def test_the_layers_are_swapped_only_inside(tiny_model):
    dit = tiny_model.token2wav.code2wav_dit_model
    before = [layer.attn for layer in dit.transformer_blocks]
    table = dit.__dict__.get("_create_block_diff")
    with block_local_layers(dit):
        inside = [layer.attn for layer in dit.transformer_blocks]
        assert all(isinstance(a, BlockLocalDiTAttention) for a in inside)
        assert [(a.back, a.ahead) for a in inside] == [
            (layer.look_backward_block, layer.look_ahead_block) for layer in dit.transformer_blocks
        ]
        assert {(a.back, a.ahead) for a in inside} != {(0, 0)}  # the preset has both bands
    assert [layer.attn for layer in dit.transformer_blocks] == before
    assert dit.__dict__.get("_create_block_diff") is table
