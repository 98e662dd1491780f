"""The Qwen2.5-Omni Talker as a ``StepRunner`` whose decode step is ``TalkerDecodeStep``:
static shapes, sampling on the device, and on a GPU one CUDA graph per (batch, KV window)
bucket, as Qwen3-Omni's (``models/qwen3_omni/talker_static_runner.py`` says how).

Prefill stays eager and samples the first code with the same device sampler. A decode step
costs the host the stacking of the rows' trailing text rows, one copy of the slot ids in and
one copy of the [B] codes out; the engine gets the codes, so it does not sample. Seeded
requests reproduce whatever batch they share; unseeded ones get a seed from the host's RNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.ar.base import ARRequest
from omni_serve.engines.ar.slot_table import SlotTable
from omni_serve.engines.ar.step_graphs import (
    GraphMode,
    StepGraphs,
    batch_buckets,
    bucket,
    length_buckets,
)
from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY, StepOutput
from omni_serve.models.qwen2_5_omni.talker_runner import TalkerRunner, TalkerState
from omni_serve.models.qwen2_5_omni.talker_step import TalkerDecodeStep

logger = logging.getLogger(__name__)


def talker_runner(talker: Any, pad_row: torch.Tensor, engine: EngineSettings, max_len: int):
    """The runner a Talker stage's engine settings ask for: with ``cuda_graphs``, the static
    step captured as CUDA graphs; otherwise the eager runner (the CPU path)."""
    if engine.cuda_graphs:
        runner = StaticTalkerRunner(talker, pad_row, engine.max_batch_size, max_len, "cuda_graph")
        started = time.perf_counter()
        graphs = runner.capture()
        logger.info(
            "Talker: %d CUDA graphs captured in %.1f s", graphs, time.perf_counter() - started
        )
        return runner
    return TalkerRunner(talker, pad_row, engine.max_batch_size, max_len)


class StaticTalkerRunner(TalkerRunner):
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
        self.padded = graph_mode != "eager"
        self.batch_buckets = batch_buckets(max_batch_size)
        self.window_buckets = length_buckets(max_len)
        self.graphs = StepGraphs(
            self.step.__call__, graph_mode, self._scratch_inputs, backend=compile_backend
        )

    def capture(self, rows: Sequence[int] = (), longest: int | None = None) -> int:
        """Captures the graphs of the batch buckets that hold ``rows`` (all if empty) times
        the window buckets up to ``longest``'s, largest first, before any request. Returns
        how many graphs are held."""
        if self.graphs.mode != "cuda_graph":
            return 0
        sizes = sorted({bucket(r, self.batch_buckets) for r in rows} or set(self.batch_buckets))
        last = bucket(longest or self.cache.max_len, self.window_buckets)
        windows = [w for w in self.window_buckets if w <= last]
        for size in reversed(sizes):
            slot_idx = torch.full((size,), self.cache.spare_slot, device=self.device)
            text = self.pad_row.expand(size, -1).clone()
            for window in reversed(windows):
                self.graphs.capture((slot_idx, text), (window,))
        return self.graphs.captured

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
        rows = len(states)
        longest = max(self.cache.lengths[s.slot] for s in states) + 1
        if longest > self.cache.max_len:
            raise RuntimeError(f"sequence longer than the KV cache ({self.cache.max_len})")
        size = bucket(rows, self.batch_buckets) if self.padded else rows
        window = bucket(longest, self.window_buckets) if self.padded else longest
        slot_ids = [s.slot for s in states] + [self.cache.spare_slot] * (size - rows)
        text = [s.trailing.popleft() if s.trailing else self.pad_row for s in states]
        text += [self.pad_row] * (size - rows)
        slot_idx = torch.tensor(slot_ids).to(self.device, non_blocking=True)
        text_rows = torch.stack([t.to(self.device, self.dtype) for t in text])
        codes = self.graphs.run((slot_idx, text_rows), (window,)).cpu()  # the step's one copy
        for state in states:
            self.cache.lengths[state.slot] += 1
        return [StepOutput(token=int(code)) for code in codes[:rows]]

    def _scratch_inputs(
        self, inputs: tuple[torch.Tensor, ...], static: tuple[int, ...]
    ) -> tuple[torch.Tensor, ...]:
        """Inputs to capture a bucket on: every row on the spare slot, whose writes are
        harmless."""
        slot_idx, text_rows = inputs
        return torch.full_like(slot_idx, self.cache.spare_slot), torch.zeros_like(text_rows)
