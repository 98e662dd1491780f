"""The Qwen2.5-Omni Talker's decode step as one static-shape function: graph-ready.

One call makes the next codec token for each of B rows: the last token's embedding plus the
row's trailing text row, through the Talker over its slot's KV, then sampled on the device.
Every shape is fixed by (B, window), every per-request value lives in the slot table on the
device, and nothing reads a tensor value on the host, so the same function runs eagerly on
the CPU, compiles with ``fullgraph=True``, and is captured as a CUDA graph per (B, window)
bucket (``talker_static_runner.py``). Rows past the live batch point at the KV cache's spare
slot, whose length is held at 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb

from omni_serve.engines.ar.device_sampling import RowSampling, apply_repetition_penalty, sample
from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.slot_table import SlotTable


class TalkerDecodeStep:
    """``step(slot_idx [B], text [B, H_thinker], window) -> [B]``: each row's next code (one
    int64 tensor, one copy off the device)."""

    def __init__(
        self, talker: nn.Module, cache: SlotKVCache, slots: SlotTable, suppress: torch.Tensor
    ):
        self.talker = talker
        self.model = talker.model
        self.cache = cache
        self.slots = slots
        self.scratch = cache.spare_slot
        self.suppress = suppress  # [V] bool

    @torch.no_grad()
    def __call__(self, slot_idx: torch.Tensor, text: torch.Tensor, window: int) -> torch.Tensor:
        s = self.slots
        inputs = self.model.get_input_embeddings()(s.next_token[slot_idx]) + text
        length = s.length[slot_idx]
        positions = (length + s.rope_delta[slot_idx]).view(1, -1, 1).expand(3, -1, 1)
        hidden = self.forward(inputs[:, None], positions, slot_idx, length, window)
        rows = s.rows(slot_idx)
        token = self.sample_next(hidden, slot_idx, rows)
        live = slot_idx != self.scratch
        s.next_token[slot_idx] = token
        s.seen[slot_idx, token] = torch.ones_like(token, dtype=torch.bool)  # no host scalar
        s.length[slot_idx] = torch.where(live, length + 1, 0)
        s.counter[slot_idx] = rows.counter + 1
        return token

    def sample_next(
        self, hidden: torch.Tensor, slot_idx: torch.Tensor, rows: RowSampling
    ) -> torch.Tensor:
        """The next code from the Talker's output rows [B, H]."""
        s = self.slots
        logits = self.talker.codec_head(hidden).float()
        logits = apply_repetition_penalty(logits, s.seen[slot_idx], s.repetition_penalty[slot_idx])
        return sample(logits.masked_fill(self.suppress, float("-inf")), rows, stream=0)

    def forward(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        slot_idx: torch.Tensor,
        length: torch.Tensor,
        window: int,
    ) -> torch.Tensor:
        """[B, 1, H_thinker] inputs at each slot's next position -> the normed output rows
        [B, H]. Attention reads the first ``window`` KV rows of each slot, masked to its
        length."""
        x = self.talker.thinker_to_talker_proj(inputs)
        cos, sin = self.model.rotary_emb(x, positions)
        key_pos = torch.arange(window, device=x.device)
        mask = (key_pos[None, :] <= length[:, None])[:, None, None, :]  # [B, 1, 1, W]
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (x.shape[0], 1, -1, attn.head_dim)
            q = attn.q_proj(h).view(shape).transpose(1, 2)
            k = attn.k_proj(h).view(shape).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = self.cache.keys[i], self.cache.values[i]
            keys[slot_idx, :, length] = k[:, :, 0]
            values[slot_idx, :, length] = v[:, :, 0]
            window_keys = keys[:, :, :window].index_select(0, slot_idx)
            window_values = values[:, :, :window].index_select(0, slot_idx)
            x = x + _attend(attn, q, window_keys, window_values, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.norm(x)[:, 0]


def _attend(
    attn: nn.Module, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """One query row per request: the query heads that share a KV head become that head's
    query rows, so no K/V head is repeated and any SDPA kernel (flash, memory-efficient) can
    run it (``enable_gqa`` sends a GPU to the math kernel)."""
    b, heads, _, d = q.shape
    kv_heads = keys.shape[1]
    q = q.reshape(b, kv_heads, heads // kv_heads, d)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
    return attn.o_proj(out.reshape(b, 1, heads * d))
