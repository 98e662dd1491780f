"""Unpacking exported KV blocks into keys and values (what a stage attending to an AR stage's
KV reads); the integration tier checks the result against transformers' own cache."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.kv_layout import dense_kv


def cpu_vec_blocks(keys: torch.Tensor, values: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pack [tokens, heads, head_size] K and V the way vLLM's CPU "vec" kernel stores them:
    per block and head, K transposed then V."""
    tokens, heads, head_size = keys.shape
    blocks = tokens // block_size
    k = keys.reshape(blocks, block_size, heads, head_size).permute(0, 2, 3, 1)  # [B, H, D, bs]
    v = values.reshape(blocks, block_size, heads, head_size).transpose(1, 2)  # [B, H, bs, D]
    packed = torch.cat([k.reshape(blocks, heads, -1), v.reshape(blocks, heads, -1)], dim=-1)
    return packed.reshape(blocks, heads, block_size, 2 * head_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_vec_blocks_unpack_to_the_keys_and_values_packed(dtype):
    keys = torch.randn(3 * 32, 2, 16).to(dtype)
    values = torch.randn(3 * 32, 2, 16).to(dtype)
    blocks = {
        "layer.0": cpu_vec_blocks(keys, values, 32),
        "layer.1": cpu_vec_blocks(values, keys, 32),
    }
    out = dense_kv(blocks, "CPU_ATTN/vec")
    assert torch.equal(out["layer.0"][0], keys) and torch.equal(out["layer.0"][1], values)
    assert torch.equal(out["layer.1"][0], values) and torch.equal(out["layer.1"][1], keys)


@pytest.mark.parametrize("layout", ["", "CPU_ATTN/amx", "FLASH_ATTN/LBNHC"])
def test_a_layout_without_a_reader_is_refused_by_name(layout):
    with pytest.raises(ValueError, match="no reader for KV layout"):
        dense_kv({"layer.0": torch.zeros(1, 2, 32, 32)}, layout)
