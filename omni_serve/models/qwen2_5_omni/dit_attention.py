"""The Token2Wav DiT's attention over each block's neighbours only.

Every DiT layer lets a mel frame attend to its own block of ``block_size`` frames, and some
layers one block back or one ahead; transformers computes that as dense attention over the
whole window with a [n, n] mask, so a 22-block window pays for 22 blocks of keys where at
most 3 can count (a third of a small-preset window's decode on a CPU core). Here each
query block meets only the key blocks its layer allows: the same softmax over the same keys
(a masked key adds exactly zero there), summed in another order, so the mel stays within
float rounding of the dense path (``test_dit_attention.py`` gives the bound).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    apply_rotary_pos_emb,
    deinterleave_head_dim,
)


def block_local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int, back: int, ahead: int
) -> torch.Tensor:
    """SDPA of q, k, v [b, h, n, d] where a frame of block i sees the frames of blocks
    [i - back, i + ahead] (blocks counted from the sequence's start): [b, h, n, d]."""
    b, h, n, d = q.shape
    blocks = -(-n // block)
    tail = blocks * block - n
    span = (back + 1 + ahead) * block
    queries = F.pad(q, (0, 0, 0, tail)).reshape(b * h, blocks, block, d)

    def windows(x: torch.Tensor) -> torch.Tensor:
        padded = F.pad(x, (0, 0, back * block, tail + ahead * block))
        # [b, h, blocks, d, span] -> [b * h, blocks, span, d]
        return padded.unfold(2, span, block).transpose(-1, -2).reshape(b * h, blocks, span, d)

    first = torch.arange(blocks, device=q.device)[:, None] * block - back * block
    position = first + torch.arange(span, device=q.device)[None]
    real = ((position >= 0) & (position < n))[None, :, None, :]  # [1, blocks, 1, span]
    out = F.scaled_dot_product_attention(queries, windows(k), windows(v), attn_mask=real)
    return out.reshape(b, h, blocks * block, d)[:, :, :n]


class BlockLocalDiTAttention(torch.nn.Module):
    """transformers' ``DiTAttention`` (its weights, its RoPE on the first head) with the
    attention restricted to the blocks ``back`` and ``ahead`` of each; the mask the decoder
    layer passes is not read."""

    def __init__(self, attention: Any, block_size: int, back: int, ahead: int) -> None:
        super().__init__()
        self.inner = attention
        self.block_size, self.back, self.ahead = block_size, back, ahead

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        attn = self.inner
        b, n, _ = hidden_states.shape
        shape = (b, n, attn.heads, -1)
        q = attn.to_q(hidden_states).view(shape).transpose(1, 2)
        k = attn.to_k(hidden_states).view(shape).transpose(1, 2)
        v = attn.to_v(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q[:, :1], k[:, :1] = apply_rotary_pos_emb(
            deinterleave_head_dim(q[:, :1]), deinterleave_head_dim(k[:, :1]), cos, sin
        )
        out = block_local_attention(q, k, v, self.block_size, self.back, self.ahead)
        out = out.transpose(1, 2).reshape(b, n, -1).to(q.dtype)
        return attn.to_out[1](attn.to_out[0](out))


@contextmanager
def block_local_layers(dit: Any) -> Iterator[None]:
    """Every decoder layer of a ``Qwen2_5OmniToken2WavDiTModel`` attends block-locally inside
    the block, and as transformers built it after (the model may be shared with code that
    wants upstream's dense path). The layers still build their [n, n] masks from the DiT's
    block table, which nothing reads meanwhile: the table shrinks to one cell."""
    layers = list(dit.transformer_blocks)
    dense = [layer.attn for layer in layers]
    table = dit.__dict__.get("_create_block_diff")
    for layer in layers:
        layer.attn = BlockLocalDiTAttention(
            layer.attn, dit.block_size, layer.look_backward_block, layer.look_ahead_block
        )
    dit._create_block_diff = lambda hidden_states: hidden_states.new_zeros(1, 1, 1, 1)
    try:
        yield
    finally:
        for layer, attn in zip(layers, dense, strict=True):
            layer.attn = attn
        if table is None:
            del dit._create_block_diff
        else:
            dit._create_block_diff = table
