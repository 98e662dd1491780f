"""The Talker's decode step as one static-shape function: graph-ready.

One call makes one codec frame for each of B rows: the code predictor's 15 passes fill
codebooks 1..15 of the frame whose codebook 0 the last step sampled, the Talker consumes the
frame, and codebook 0 of the next frame is sampled, all on the device. Every shape is fixed
by (B, window), every per-request value (KV length, last hidden row, next token, sampling
settings, seed, tokens seen) lives in a slot table on the device, and nothing reads a tensor
value on the host: no ``.item()``, no branch on data, no allocation that depends on data. So
the same function runs eagerly on the CPU, compiles with ``fullgraph=True``, and is captured
as a CUDA graph per (B, window) bucket.

Rows past the live batch point at the scratch slot (the KV cache's spare row), whose length
is held at 0, so padding never grows or touches a live request's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.moe import batched_mm_experts_forward
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from omni_serve.engines.ar.device_sampling import (
    RowSampling,
    apply_repetition_penalty,
    sample,
    sample_fixed,
    to_gumbel,
    uniform_streams,
)
from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.slot_table import SlotTable

# transformers' code predictor draws with these when sampling (its generate() call).
PREDICTOR_TEMPERATURE, PREDICTOR_TOP_K, PREDICTOR_TOP_P = 1.0, 50, 0.8


@dataclass
class TalkerSlots(SlotTable):
    """The slot table with each slot's last Talker output row (the code predictor's input)."""

    last_hidden: torch.Tensor  # [S, H]

    @classmethod
    def allocate(
        cls, slots: int, hidden: int, vocab: int, dtype: torch.dtype, device: torch.device | str
    ) -> TalkerSlots:
        last = torch.zeros(slots, hidden, dtype=dtype, device=device)
        return cls(**cls.allocated(slots, vocab, device), last_hidden=last)


class TalkerDecodeStep:
    """``step(slot_idx [B], text [B, H], window) -> [B, 17]``: each row's frame (16 codes)
    and the next frame's codebook 0, as one int64 tensor (one copy off the device)."""

    def __init__(
        self, talker: nn.Module, cache: SlotKVCache, slots: TalkerSlots, suppress: torch.Tensor
    ):
        self.talker = talker
        self.model = talker.model
        self.predictor = talker.code_predictor
        self.cache = cache
        self.slots = slots
        self.scratch = cache.spare_slot
        self.suppress = suppress  # [V] bool
        self.num_residuals = self.predictor.config.num_code_groups - 1
        device, dtype = talker.codec_head.weight.device, talker.codec_head.weight.dtype
        probe = torch.zeros(1, dtype=dtype, device=device)
        positions = torch.arange(self.num_residuals + 1, device=device)[None]
        self.predictor_rope = self.predictor.model.rotary_emb(probe, positions)

    @torch.no_grad()
    def __call__(self, slot_idx: torch.Tensor, text: torch.Tensor, window: int) -> torch.Tensor:
        s = self.slots
        c0 = s.next_token[slot_idx]
        c0_embed = self.model.get_input_embeddings()(c0)[:, None]  # [B, 1, H]
        rows = s.rows(slot_idx)
        greedy = rows.temperature <= 0
        residuals, residual_sum = self.residuals(
            s.last_hidden[slot_idx][:, None], c0_embed, greedy, rows
        )
        length = s.length[slot_idx]
        positions = (length + s.rope_delta[slot_idx]).view(1, -1, 1).expand(3, -1, 1)
        hidden = self.talker_forward(
            c0_embed + residual_sum + text[:, None], positions, slot_idx, length, window
        )
        token = self.sample_next(hidden, slot_idx, rows)
        live = slot_idx != self.scratch
        s.last_hidden[slot_idx] = hidden
        s.next_token[slot_idx] = token
        s.seen[slot_idx, token] = torch.ones_like(token, dtype=torch.bool)  # no host scalar
        s.length[slot_idx] = torch.where(live, length + 1, 0)
        s.counter[slot_idx] = rows.counter + 1
        return torch.cat([c0[:, None], residuals, token[:, None]], dim=1)

    def sample_next(
        self, hidden: torch.Tensor, slot_idx: torch.Tensor, rows: RowSampling
    ) -> torch.Tensor:
        """Codebook 0 of the next frame from the Talker's output rows [B, H]."""
        s = self.slots
        logits = self.talker.codec_head(hidden).float()
        logits = apply_repetition_penalty(logits, s.seen[slot_idx], s.repetition_penalty[slot_idx])
        return sample(logits.masked_fill(self.suppress, float("-inf")), rows, stream=0)

    # -- the code predictor: 15 passes over one frame --------------------------------------

    def residuals(
        self, past: torch.Tensor, c0_embed: torch.Tensor, greedy: torch.Tensor, rows: RowSampling
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..15 of each row's frame [B, 15], and the sum of their embeddings."""
        model = self.predictor.model
        cfg = self.predictor.config
        kv_shape = (past.shape[0], cfg.num_key_value_heads, self.num_residuals + 1, cfg.head_dim)
        caches = [(past.new_empty(kv_shape), past.new_empty(kv_shape)) for _ in model.layers]
        x = torch.cat([past, c0_embed], dim=1)
        noise = to_gumbel(
            uniform_streams(rows.seed, rows.counter, 1, self.num_residuals, PREDICTOR_TOP_K)
        )
        codes, embed_sum, start = [], torch.zeros_like(c0_embed), 0
        for j in range(self.num_residuals):
            end = start + x.shape[1]
            cos, sin = (t[:, start:end] for t in self.predictor_rope)
            hidden = x
            for layer, (keys, values) in zip(model.layers, caches, strict=True):
                attn_in = _rms_norm(layer.input_layernorm, hidden)
                q, k, v = _project_qkv(layer.self_attn, attn_in, cos, sin)
                keys[:, :, start:end], values[:, :, start:end] = k, v
                hidden = hidden + _attend(layer.self_attn, q, keys[:, :, :end], values[:, :, :end])
                hidden = hidden + layer.mlp(_rms_norm(layer.post_attention_layernorm, hidden))
            logits = self.predictor.lm_head[j](_rms_norm(model.norm, hidden[:, -1])).float()
            token = sample_fixed(
                logits,
                greedy,
                noise[:, j],
                temperature=PREDICTOR_TEMPERATURE,
                top_k=PREDICTOR_TOP_K,
                top_p=PREDICTOR_TOP_P,
            )
            codes.append(token)
            x = model.get_input_embeddings()[j](token)[:, None]
            embed_sum = embed_sum + x
            start = end
        return torch.stack(codes, dim=1), embed_sum

    # -- the Talker: one row per request over its slot's KV --------------------------------

    def talker_forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slot_idx: torch.Tensor,
        length: torch.Tensor,
        window: int,
    ) -> torch.Tensor:
        """[B, 1, H] inputs at each slot's next position -> the normed output rows [B, H].
        Attention reads the first ``window`` KV rows of each slot, masked to its length."""
        cos, sin = self.model.rotary_emb(x, positions)
        key_pos = torch.arange(window, device=x.device)
        mask = (key_pos[None, :] <= length[:, None])[:, None, None, :]  # [B, 1, 1, W]
        for i, layer in enumerate(self.model.layers):
            q, k, v = _project_qkv(layer.self_attn, _rms_norm(layer.input_layernorm, x), cos, sin)
            keys, values = self.cache.keys[i], self.cache.values[i]
            keys[slot_idx, :, length] = k[:, :, 0]
            values[slot_idx, :, length] = v[:, :, 0]
            window_keys = keys[:, :, :window].index_select(0, slot_idx)
            window_values = values[:, :, :window].index_select(0, slot_idx)
            x = x + _attend(layer.self_attn, q, window_keys, window_values, mask)
            x = x + _mlp(layer.mlp, _rms_norm(layer.post_attention_layernorm, x))
        return _rms_norm(self.model.norm, x)[:, 0]


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A transformers RMSNorm module's output, as ``F.rms_norm``: one fused kernel on a GPU
    where the module launches six (eight in bf16, with its casts). A step runs ~220 norms, the
    largest share of a launch-bound graph's kernels. fp32 gives the module's values; bf16 rounds
    once instead of twice (it scales by the weight before the cast to bf16, not after)."""
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def _project_qkv(
    attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``talker_runner.project_qkv`` with the fused norm: q, k, v [b, heads, L, d]."""
    b, length, _ = x.shape
    shape = (b, length, -1, attn.head_dim)
    q = _rms_norm(attn.q_norm, attn.q_proj(x).view(shape)).transpose(1, 2)
    k = _rms_norm(attn.k_norm, attn.k_proj(x).view(shape)).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v


def _attend(
    attn: nn.Module,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention output [b, L, H]. One query row: the query heads that share a KV head become
    that head's query rows, so no K/V head is repeated and any SDPA kernel (flash, memory-
    efficient) can run it; ``enable_gqa`` sends a GPU to the math kernel. Several rows (the
    code predictor's first pass, over exactly those rows) are causal."""
    b, heads, length, d = q.shape
    kv_heads = keys.shape[1]
    if length == 1:
        q = q.reshape(b, kv_heads, heads // kv_heads, d)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        return attn.o_proj(out.reshape(b, 1, heads * d))
    keys = keys.repeat_interleave(heads // kv_heads, dim=1)
    values = values.repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(b, length, heads * d))


def _mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Talker's MLP with static shapes. Its sparse MoE block routes each row to top-k
    experts, which transformers' eager path runs as a loop over the experts hit (a host sync
    and data-dependent shapes). Here every shape is fixed: with more (row, expert) pairs than
    experts, all experts run on all rows and the router's weights (zero elsewhere) mix them,
    reading each expert's weights once; with fewer, each pair's weights are gathered
    (transformers' ``batched_mm`` experts)."""
    if not hasattr(mlp, "experts"):
        return mlp(x)
    flat = x.reshape(-1, x.shape[-1])
    shared = mlp.shared_expert(flat) * torch.sigmoid(mlp.shared_expert_gate(flat))
    _, weights, chosen = mlp.gate(flat)
    experts = mlp.experts
    if flat.shape[0] * chosen.shape[1] >= experts.num_experts:
        gate_up = torch.einsum("th,eoh->teo", flat, experts.gate_up_proj)
        out = torch.einsum("tei,ehi->teh", experts._apply_gate(gate_up), experts.down_proj)
        mix = torch.zeros(flat.shape[0], experts.num_experts, dtype=out.dtype, device=out.device)
        routed = (out * mix.scatter(1, chosen, weights.to(out.dtype))[..., None]).sum(1)
    else:
        routed = batched_mm_experts_forward(experts, flat, chosen, weights)
    return (routed + shared).view_as(x)
