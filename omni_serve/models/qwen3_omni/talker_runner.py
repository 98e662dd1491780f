"""The Qwen3-Omni Talker + code predictor as a ``StepRunner`` for the torch AR engine.

vLLM has no Talker, so this runs transformers' own Talker modules (their weights and
sub-layers) with a slot KV cache, so that concurrent requests decode in one batch. One decode
step = the code predictor fills codebooks 1..15 for the current frame (batched, in lockstep
across requests), then the Talker consumes the frame's summed code embeddings plus one
trailing text row and predicts the next frame's codebook 0.

The code predictor's 15 short passes also run on its own sub-layers here rather than through
its ``forward``: every row of a frame sits at the same positions, so no mask is needed, the
rotary table is computed once, and the KV cache is one preallocated buffer per layer; the
mask building and cache bookkeeping of 15 model calls per step were ~10% of a step at batch 4.

The runner computes where the Talker's weights are (a GPU when the stage reserves one). Logits
and codes come back to the CPU once per step for the engine's sampler and the Code2wav edge;
the code predictor's sampled rows are drawn on the CPU too, with the requests' CPU generators
(greedy rows stay on the device).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.fed_slot_runner import FedSlotRunner
from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.sampling import sample_rows
from omni_serve.engines.ar.torch_engine import StepOutput

# A layer's keys, values and attention mask (None: no mask needed) after storing its new K/V.
KVView = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
StoreKV = Callable[[int, torch.Tensor, torch.Tensor], KVView]

# transformers' code predictor draws with these when sampling (its generate() call).
CODE_PREDICTOR_SAMPLING = SamplingConfig(temperature=1.0, top_k=50, top_p=0.8)


@dataclass
class TalkerState:
    """Inputs: ``extra`` of the ARRequest carries ``position_ids`` [3, T], ``rope_delta``,
    ``trailing`` (rows [H]) and ``text_done``; more rows arrive through ``feed``."""

    prompt_embeds: torch.Tensor
    position_ids: torch.Tensor
    rope_delta: int
    greedy: bool
    trailing: deque = field(default_factory=deque)
    text_done: bool = False
    step: int = 0
    slot: int | None = None
    last_hidden: torch.Tensor | None = None
    generator: torch.Generator | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


class TalkerRunner(FedSlotRunner):
    def __init__(
        self,
        talker: nn.Module,
        tts_pad: torch.Tensor,
        max_batch_size: int = 8,
        max_len: int = 4096,
        spare_slot: bool = False,
    ) -> None:
        self.talker = talker.eval()
        self.model = talker.model
        self.predictor = talker.code_predictor
        self.tts_pad = tts_pad
        self.max_batch_size = max_batch_size
        self.device = talker.codec_head.weight.device
        text_cfg = talker.config.text_config
        head_dim = (
            getattr(text_cfg, "head_dim", None)
            or text_cfg.hidden_size // text_cfg.num_attention_heads
        )
        self.cache = SlotKVCache(
            num_layers=text_cfg.num_hidden_layers,
            num_slots=max_batch_size,
            num_kv_heads=text_cfg.num_key_value_heads,
            head_dim=head_dim,
            max_len=max_len,
            dtype=talker.codec_head.weight.dtype,
            device=self.device,
            spare_slot=spare_slot,
        )
        predictor_cfg = self.predictor.config
        self.num_residuals = predictor_cfg.num_code_groups - 1
        # Positions 0..15 of every frame: cos/sin once (the same elementwise values per call).
        probe = torch.zeros(1, dtype=talker.codec_head.weight.dtype, device=self.device)
        self._predictor_rope = self.predictor.model.rotary_emb(
            probe, torch.arange(self.num_residuals + 1, device=self.device)[None]
        )
        self._predictor_kv_shape = (
            predictor_cfg.num_key_value_heads,
            self.num_residuals + 1,
            getattr(predictor_cfg, "head_dim", None)
            or predictor_cfg.hidden_size // predictor_cfg.num_attention_heads,
        )
        vocab = text_cfg.vocab_size
        eos = talker.config.codec_eos_token_id
        # transformers suppresses the top 1024 ids (special codec tokens) except EOS.
        self._suppress = torch.tensor([i for i in range(vocab - 1024, vocab) if i != eos])
        self.codec_eos_token_id = eos

    # -- StepRunner protocol ---------------------------------------------------------------

    def new_state(self, request: ARRequest) -> TalkerState:
        if request.prompt_embeds is None:
            raise ValueError("the Talker takes prompt_embeds (built by TalkerInputBuilder)")
        extra = request.extra
        state = TalkerState(
            prompt_embeds=request.prompt_embeds,
            position_ids=extra.get(
                "position_ids", torch.arange(len(request.prompt_embeds)).expand(3, -1)
            ),
            rope_delta=int(extra.get("rope_delta", 0)),
            greedy=request.sampling.greedy,
            trailing=deque(extra.get("trailing", ())),
            text_done=bool(extra.get("text_done", False)),
            sampling=request.sampling,
        )
        if request.sampling.seed is not None:
            state.generator = torch.Generator().manual_seed(request.sampling.seed + 1)
        return state

    @torch.no_grad()
    def prefill(self, state: TalkerState) -> StepOutput:
        state.slot = self.cache.allocate()
        embeds = state.prompt_embeds.to(self.device, self.tts_pad.dtype)[None]
        positions = state.position_ids.to(self.device)[:, None, :]
        hidden = self._forward([state.slot], embeds, positions)
        state.last_hidden = hidden[0, -1]
        return StepOutput(logits=self.talker.codec_head(hidden[0, -1]).cpu())

    @torch.no_grad()
    def decode(self, states: list[TalkerState], last_tokens: list[int]) -> list[StepOutput]:
        c0 = torch.tensor(last_tokens, device=self.device)
        c0_embed = self.model.get_input_embeddings()(c0)[:, None]  # [b, 1, H]
        past_hidden = torch.stack([s.last_hidden for s in states])[:, None]
        residual_codes, residual_sum = self._predict_residuals(states, past_hidden, c0_embed)
        text = torch.stack(
            [s.trailing.popleft() if s.trailing else self.tts_pad for s in states]
        ).to(self.device)
        inputs = c0_embed + residual_sum + text[:, None]
        slots = [s.slot for s in states]
        positions = (
            torch.tensor(
                [self.cache.lengths[s.slot] + s.rope_delta for s in states], device=self.device
            )
            .view(1, -1, 1)
            .expand(3, -1, 1)
        )
        hidden = self._forward(slots, inputs, positions)[:, -1]
        logits = self.talker.codec_head(hidden).cpu()  # one copy per step, for the sampler
        frames = torch.cat([c0[:, None], residual_codes], dim=1).cpu()  # to Code2wav
        outs = []
        for i, state in enumerate(states):
            state.last_hidden = hidden[i]
            state.step += 1
            outs.append(StepOutput(logits=logits[i], outputs={"codes": frames[i]}))
        return outs

    # -- math ------------------------------------------------------------------------------

    def _predict_residuals(
        self, states: list[TalkerState], past_hidden: torch.Tensor, c0_embed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..15 for each row's frame, and the sum of their embeddings."""
        model = self.predictor.model
        shape = (len(states), *self._predictor_kv_shape)
        keys = [c0_embed.new_empty(shape) for _ in model.layers]
        values = [c0_embed.new_empty(shape) for _ in model.layers]
        x = torch.cat([past_hidden, c0_embed], dim=1)
        codes, embed_sum, start = [], torch.zeros_like(c0_embed), 0
        for j in range(self.num_residuals):
            hidden = self._predictor_forward(x, start, keys, values)
            start += x.shape[1]
            logits = self.predictor.lm_head[j](hidden[:, -1])
            token = self._sample_residual(states, logits)
            codes.append(token)
            x = model.get_input_embeddings()[j](token)[:, None]
            embed_sum = embed_sum + x
        return torch.stack(codes, dim=1), embed_sum

    def _predictor_forward(
        self, x: torch.Tensor, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        """The code predictor's decoder over [b, L, H] inputs at positions start..start+L-1,
        every row at the same positions (the frame's lockstep)."""
        model = self.predictor.model
        end = start + x.shape[1]
        cos, sin = (t[:, start:end] for t in self._predictor_rope)

        def store(layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> KVView:
            keys[layer_idx][:, :, start:end] = k
            values[layer_idx][:, :, start:end] = v
            return keys[layer_idx][:, :, :end], values[layer_idx][:, :, :end], None

        return model.norm(self._decoder(model.layers, x, cos, sin, store))

    @staticmethod
    def _sample_residual(states: list[TalkerState], logits: torch.Tensor) -> torch.Tensor:
        """Batched sampling of one code group: greedy rows by argmax, sampled rows together."""
        token = torch.argmax(logits, dim=-1)
        rows = [i for i, s in enumerate(states) if not s.greedy]
        if rows:
            picks = sample_rows(
                logits[rows].cpu(), CODE_PREDICTOR_SAMPLING, [states[i].generator for i in rows]
            )
            token[rows] = picks.to(token.device)
        return token

    def _forward(
        self, slots: list[int], embeds: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Run the Talker decoder over [b, L, H] new inputs at the slots' offsets."""
        cos, sin = self.model.rotary_emb(embeds, positions)

        def store(layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> KVView:
            return self.cache.append(layer_idx, slots, k, v)

        hidden = self._decoder(self.model.layers, embeds, cos, sin, store)
        self.cache.advance(slots, embeds.shape[1])
        return self.model.norm(hidden)

    def _decoder(
        self,
        layers: nn.ModuleList,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        store: StoreKV,
    ) -> torch.Tensor:
        """Pre-norm decoder layers (the Talker's and the code predictor's have the same shape);
        ``store`` puts a layer's new keys/values in its cache and returns what to attend to."""
        for i, layer in enumerate(layers):
            hidden = hidden + self._attention(
                layer.self_attn, layer.input_layernorm(hidden), cos, sin, partial(store, i)
            )
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return hidden

    @staticmethod
    def _attention(
        attn: nn.Module,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        store: Callable[[torch.Tensor, torch.Tensor], KVView],
    ) -> torch.Tensor:
        """``store(k, v)``: the keys/values to attend to and their mask. None means no mask
        is needed: one new row, or new rows that are all the cache holds (causal among
        themselves; SDPA's ``is_causal`` aligns queries to the first keys)."""
        b, length, _ = x.shape
        q, k, v = project_qkv(attn, x, cos, sin)
        keys, values, mask = store(k, v)
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            keys,
            values,
            attn_mask=mask,
            is_causal=mask is None and length > 1,
            scale=attn.scaling,
            enable_gqa=True,
        )
        return attn.o_proj(out.transpose(1, 2).reshape(b, length, -1))


def project_qkv(
    attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [b, heads, L, d] of [b, L, H] inputs, normed and rotated (a Talker or code
    predictor attention layer's own projections)."""
    b, length, _ = x.shape
    shape = (b, length, -1, attn.head_dim)
    q = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v
