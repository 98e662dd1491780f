"""The Qwen2.5-Omni Talker as a ``StepRunner`` for the torch AR engine.

A plain AR decoder over codec tokens (no code predictor): one decode step takes the last
code's embedding plus one trailing text row (``talker_inputs``), projects it to the Talker's
width, and predicts the next code. It runs transformers' own sub-layers with a slot KV cache
so that concurrent replies decode in one batch. vLLM cannot take it: a step's input is a row
that arrives while the request runs, and vLLM takes embeddings only in the prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.fed_slot_runner import FedSlotRunner
from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.torch_engine import StepOutput


@dataclass
class TalkerState:
    """``extra`` of the ARRequest carries ``position_ids`` [3, T], ``rope_delta``,
    ``trailing`` (rows [H_thinker]) and ``text_done``; more rows arrive through ``feed``."""

    prompt_embeds: torch.Tensor
    position_ids: torch.Tensor
    rope_delta: int
    trailing: deque = field(default_factory=deque)
    text_done: bool = False
    slot: int | None = None
    # The static runner's (it samples on the device): the request's settings, and the codec
    # ids its repetition penalty counts as seen before the first code.
    sampling: SamplingConfig | None = None
    history: list[int] = field(default_factory=list)


class TalkerRunner(FedSlotRunner):
    def __init__(
        self,
        talker: Any,
        pad_row: torch.Tensor,
        max_batch_size: int = 8,
        max_len: int = 4096,
        spare_slot: bool = False,
    ) -> None:
        """``pad_row``: what a step reads once the text has run out (``tts_pad``'s row);
        ``spare_slot``: a KV row the static step points padding at."""
        self.talker = talker.eval()
        self.model = talker.model
        self.max_batch_size = max_batch_size
        weight = talker.codec_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.pad_row = pad_row.to(self.device, self.dtype)
        cfg = talker.config
        self.cache = SlotKVCache(
            num_layers=cfg.num_hidden_layers,
            num_slots=max_batch_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=self.model.layers[0].self_attn.head_dim,
            max_len=max_len,
            dtype=self.dtype,
            device=self.device,
            spare_slot=spare_slot,
        )
        # transformers' generate suppresses the codec bos; it stops on the codec end and pad.
        self._suppress = torch.tensor([cfg.tts_codec_start_token_id])
        self.stop_token_ids = (cfg.tts_codec_pad_token_id, cfg.tts_codec_end_token_id)

    # -- StepRunner protocol ---------------------------------------------------------------

    def new_state(self, request: ARRequest) -> TalkerState:
        if request.prompt_embeds is None:
            raise ValueError("the Talker takes prompt_embeds (built by TalkerInputBuilder)")
        extra = request.extra
        length = len(request.prompt_embeds)
        return TalkerState(
            prompt_embeds=request.prompt_embeds,
            position_ids=extra.get("position_ids", torch.arange(length).expand(3, -1)),
            rope_delta=int(extra.get("rope_delta", 0)),
            trailing=deque(extra.get("trailing", ())),
            text_done=bool(extra.get("text_done", False)),
        )

    @torch.no_grad()
    def prefill(self, state: TalkerState) -> StepOutput:
        state.slot = self.cache.allocate()
        embeds = state.prompt_embeds.to(self.device, self.dtype)[None]
        positions = state.position_ids.to(self.device)[:, None, :]
        hidden = self._forward([state.slot], embeds, positions)
        return StepOutput(logits=self.talker.codec_head(hidden[0, -1]).float().cpu())

    @torch.no_grad()
    def decode(self, states: list[TalkerState], last_tokens: list[int]) -> list[StepOutput]:
        codes = torch.tensor(last_tokens, device=self.device)
        text = [s.trailing.popleft() if s.trailing else self.pad_row for s in states]
        rows = torch.stack([r.to(self.device, self.dtype) for r in text])
        inputs = (self.model.get_input_embeddings()(codes) + rows)[:, None]
        slots = [s.slot for s in states]
        positions = torch.tensor(
            [self.cache.lengths[s.slot] + s.rope_delta for s in states], device=self.device
        ).view(1, -1, 1)
        hidden = self._forward(slots, inputs, positions.expand(3, -1, 1))
        logits = self.talker.codec_head(hidden[:, -1]).float().cpu()  # one copy per step
        return [StepOutput(logits=row) for row in logits]

    # -- math ------------------------------------------------------------------------------

    def _forward(
        self, slots: list[int], embeds: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The Talker decoder over [b, L, H_thinker] new inputs at the slots' offsets."""
        hidden = self.talker.thinker_to_talker_proj(embeds)
        cos, sin = self.model.rotary_emb(hidden, positions)
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            b, length, _ = x.shape
            shape = (b, length, -1, attn.head_dim)
            q = attn.q_proj(x).view(shape).transpose(1, 2)
            k = attn.k_proj(x).view(shape).transpose(1, 2)
            v = attn.v_proj(x).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values, mask = self.cache.append(i, slots, k, v)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
            )
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, length, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        self.cache.advance(slots, embeds.shape[1])
        return self.model.norm(hidden)
