"""The Talker as a ``StepRunner`` whose decode step is ``TalkerDecodeStep``: static shapes,
sampling on the device, and on a GPU one CUDA graph per (batch, KV window) bucket.

Prefill stays eager (one request, any prompt length, once per reply) and samples its first
token with the same device sampler. A decode step costs the host three things: stacking the
rows' trailing text rows, one copy of the slot ids in, and one copy of the [B, 17] result
out; the sampled token goes to the engine with the frame, so the engine does not sample.

Seeded requests reproduce: a draw depends on the seed, the step and the code group only, so
not on the batch a request shares or on the graph mode. Unseeded requests get a seed from
the host's RNG when they arrive.
"""

from __future__ import annotations

import torch
from torch import nn

from omni_serve.config import EngineSettings
from omni_serve.engines.ar.base import ARRequest
from omni_serve.engines.ar.padded_steps import PaddedSteps, captured
from omni_serve.engines.ar.step_graphs import GraphMode
from omni_serve.engines.ar.torch_engine import StepOutput
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner, TalkerState
from omni_serve.models.qwen3_omni.talker_step import TalkerDecodeStep, TalkerSlots


def talker_runner(
    talker: nn.Module, tts_pad: torch.Tensor, engine: EngineSettings, max_len: int
) -> TalkerRunner:
    """The runner a Talker stage's engine settings ask for: with ``cuda_graphs``, the static
    step captured as CUDA graphs; otherwise the eager runner (the CPU path)."""
    if engine.cuda_graphs:
        return captured(
            StaticTalkerRunner(talker, tts_pad, engine.max_batch_size, max_len, "cuda_graph")
        )
    return TalkerRunner(talker, tts_pad, max_batch_size=engine.max_batch_size, max_len=max_len)


class StaticTalkerRunner(PaddedSteps, TalkerRunner):
    """``graph_mode`` picks how the step runs (``step_graphs``). Outside ``eager`` the batch
    is padded to a bucket and the KV window rounded up to one, so a bounded set of shapes
    (at most len(batch buckets) x len(window buckets)) is ever compiled or captured."""

    def __init__(
        self,
        talker: nn.Module,
        tts_pad: torch.Tensor,
        max_batch_size: int = 8,
        max_len: int = 4096,
        graph_mode: GraphMode = "eager",
        compile_backend: str = "inductor",
    ) -> None:
        super().__init__(talker, tts_pad, max_batch_size, max_len, spare_slot=True)
        hidden = tts_pad.shape[-1]
        vocab = talker.config.text_config.vocab_size
        suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        suppress[self._suppress.to(self.device)] = True
        self.slots = TalkerSlots.allocate(
            self.max_batch_size + 1, hidden, vocab, tts_pad.dtype, self.device
        )
        self.step = TalkerDecodeStep(talker, self.cache, self.slots, suppress)
        self.pad_row, self.dtype = tts_pad, tts_pad.dtype  # what PaddedSteps reads
        self._use_step(self.step.__call__, graph_mode, compile_backend, max_batch_size, max_len)

    def new_state(self, request: ARRequest) -> TalkerState:
        state = super().new_state(request)
        state.generator = None  # draws come from the device hash, keyed by the seed
        return state

    @torch.no_grad()
    def prefill(self, state: TalkerState) -> StepOutput:
        embeds = state.prompt_embeds.to(self.device, self.tts_pad.dtype)[None]
        positions = state.position_ids.to(self.device)[:, None, :]
        state.slot = self.cache.allocate()
        hidden = self._forward([state.slot], embeds, positions)[:, -1]
        self._admit(state, hidden)
        slot_idx = torch.tensor([state.slot], device=self.device)
        token = self.step.sample_next(hidden, slot_idx, self.slots.rows(slot_idx))
        self.slots.took_first(slot_idx, token)
        return StepOutput(token=int(token[0]))

    @torch.no_grad()
    def decode(self, states: list[TalkerState], last_tokens: list[int]) -> list[StepOutput]:
        """``last_tokens`` are already on the device (each slot's ``next_token``)."""
        out = self._step_rows(states)
        outs = []
        for i, state in enumerate(states):
            state.step += 1
            outs.append(StepOutput(outputs={"codes": out[i, :16]}, token=int(out[i, 16])))
        return outs

    def _admit(self, state: TalkerState, hidden: torch.Tensor) -> None:
        """Write a prefilled request's row of the slot table."""
        slot = state.slot
        self.slots.last_hidden[slot] = hidden[0]
        self.slots.admit(slot, self.cache.lengths[slot], state.rope_delta, state.sampling)
