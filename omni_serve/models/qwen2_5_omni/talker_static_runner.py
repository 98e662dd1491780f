"""The Qwen2.5-Omni Talker as a ``StepRunner`` whose decode step is ``TalkerDecodeStep``:
static shapes, sampling on the device, and on a GPU one CUDA graph per (batch, KV window)
bucket, as Qwen3-Omni's (``models/qwen3_omni/talker_static_runner.py`` says how).

Prefill stays eager and samples the first code with the same device sampler. A decode step
costs the host the stacking of the rows' trailing text rows, one copy of the slot ids in and
one copy of the [B] codes out; the engine gets the codes, so it does not sample. Seeded
requests reproduce whatever batch they share; unseeded ones get a seed from the host's RNG.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.ar.base import ARRequest
from omni_serve.engines.ar.padded_steps import PaddedSteps, captured
from omni_serve.engines.ar.slot_table import SlotTable
from omni_serve.engines.ar.step_graphs import GraphMode
from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY, StepOutput
from omni_serve.models.qwen2_5_omni.talker_runner import TalkerRunner, TalkerState
from omni_serve.models.qwen2_5_omni.talker_step import TalkerDecodeStep


def talker_runner(
    talker: Any, pad_row: torch.Tensor, engine: EngineSettings, max_len: int
) -> TalkerRunner:
    """The runner a Talker stage's engine settings ask for: with ``cuda_graphs``, the static
    step captured as CUDA graphs; otherwise the eager runner (the CPU path)."""
    if engine.cuda_graphs:
        return captured(
            StaticTalkerRunner(talker, pad_row, engine.max_batch_size, max_len, "cuda_graph")
        )
    return TalkerRunner(talker, pad_row, engine.max_batch_size, max_len)


class StaticTalkerRunner(PaddedSteps, TalkerRunner):
    """``graph_mode`` picks how the step runs (``step_graphs``). Outside ``eager`` the batch
    is padded to a bucket and the KV window rounded up to one."""

    def __init__(
        self,
        talker: Any,
        pad_row: torch.Tensor,
        max_batch_size: int = 8,
        max_len: int = 4096,
        graph_mode: GraphMode = "eager",
        compile_backend: str = "inductor",
    ) -> None:
        super().__init__(talker, pad_row, max_batch_size, max_len, spare_slot=True)
        vocab = talker.codec_head.weight.shape[0]
        suppress = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        suppress[self._suppress.to(self.device)] = True
        self.slots = SlotTable.allocate(max_batch_size + 1, vocab, self.device)
        self.step = TalkerDecodeStep(talker, self.cache, self.slots, suppress)
        self._use_step(self.step.__call__, graph_mode, compile_backend, max_batch_size, max_len)

    def new_state(self, request: ARRequest) -> TalkerState:
        state = super().new_state(request)
        state.sampling = request.sampling
        state.history = list(request.extra.get(PENALTY_HISTORY, ()))
        return state

    @torch.no_grad()
    def prefill(self, state: TalkerState) -> StepOutput:
        embeds = state.prompt_embeds.to(self.device, self.dtype)[None]
        positions = state.position_ids.to(self.device)[:, None, :]
        slot = state.slot = self.cache.allocate()
        hidden = self._forward([slot], embeds, positions)[:, -1]
        self.slots.admit(slot, self.cache.lengths[slot], state.rope_delta, state.sampling)
        if state.history:  # transformers counts the prompt's codec ids as seen
            self.slots.seen[slot, torch.tensor(state.history, device=self.device)] = True
        slot_idx = torch.tensor([slot], device=self.device)
        token = self.step.sample_next(hidden, slot_idx, self.slots.rows(slot_idx))
        self.slots.took_first(slot_idx, token)
        return StepOutput(token=int(token[0]))

    @torch.no_grad()
    def decode(self, states: list[TalkerState], last_tokens: list[int]) -> list[StepOutput]:
        """``last_tokens`` are already on the device (each slot's ``next_token``)."""
        return [StepOutput(token=int(code)) for code in self._step_rows(states)]
