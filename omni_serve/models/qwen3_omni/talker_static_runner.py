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

import logging
import time
from collections.abc import Sequence

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.ar.base import ARRequest
from omni_serve.engines.ar.step_graphs import (
    GraphMode,
    StepGraphs,
    batch_buckets,
    bucket,
    length_buckets,
)
from omni_serve.engines.ar.torch_engine import StepOutput
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner, TalkerState
from omni_serve.models.qwen3_omni.talker_step import TalkerDecodeStep, TalkerSlots

logger = logging.getLogger(__name__)


def talker_runner(talker, tts_pad: torch.Tensor, engine: EngineSettings, max_len: int):
    """The runner a Talker stage's engine settings ask for: with ``cuda_graphs``, the static
    step captured as CUDA graphs; otherwise the eager runner (the CPU path)."""
    if engine.cuda_graphs:
        runner = StaticTalkerRunner(talker, tts_pad, engine.max_batch_size, max_len, "cuda_graph")
        started = time.perf_counter()
        graphs = runner.capture()
        logger.info(
            "Talker: %d CUDA graphs captured in %.1f s", graphs, time.perf_counter() - started
        )
        return runner
    return TalkerRunner(talker, tts_pad, max_batch_size=engine.max_batch_size, max_len=max_len)


class StaticTalkerRunner(TalkerRunner):
    """``graph_mode`` picks how the step runs (``step_graphs``). Outside ``eager`` the batch
    is padded to a bucket and the KV window rounded up to one, so a bounded set of shapes
    (at most len(batch buckets) x len(window buckets)) is ever compiled or captured."""

    def __init__(
        self,
        talker,
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
        self.padded = graph_mode != "eager"
        self.batch_buckets = batch_buckets(max_batch_size)
        self.window_buckets = length_buckets(max_len)
        self.graphs = StepGraphs(
            self.step.__call__, graph_mode, self._scratch_inputs, backend=compile_backend
        )

    def capture(self, rows: Sequence[int] = (), longest: int | None = None) -> int:
        """Captures, before any request, the graphs of the batch buckets that hold ``rows``
        (every bucket if empty) times the window buckets up to the one that holds
        ``longest`` (the KV cache's length if None), largest first so the smaller ones reuse
        its memory, as vLLM does at start-up. A bucket first met mid-reply would stall every
        row of that step for its capture (two eager warm-up steps and the capture itself).
        Returns how many graphs are held."""
        if self.graphs.mode != "cuda_graph":
            return 0
        sizes = sorted({bucket(r, self.batch_buckets) for r in rows} or set(self.batch_buckets))
        last = bucket(longest or self.cache.max_len, self.window_buckets)
        windows = [w for w in self.window_buckets if w <= last]
        hidden, dtype = self.tts_pad.shape[-1], self.tts_pad.dtype
        for size in reversed(sizes):
            slot_idx = torch.full((size,), self.cache.spare_slot, device=self.device)
            text = torch.zeros(size, hidden, dtype=dtype, device=self.device)
            for window in reversed(windows):
                self.graphs.capture((slot_idx, text), (window,))
        return self.graphs.captured

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
        rows = len(states)
        longest = max(self.cache.lengths[s.slot] for s in states) + 1
        if longest > self.cache.max_len:
            raise RuntimeError(f"sequence longer than the KV cache ({self.cache.max_len})")
        size = bucket(rows, self.batch_buckets) if self.padded else rows
        window = bucket(longest, self.window_buckets) if self.padded else longest
        slot_ids = [s.slot for s in states] + [self.cache.spare_slot] * (size - rows)
        text = [s.trailing.popleft() if s.trailing else self.tts_pad for s in states]
        text += [self.tts_pad] * (size - rows)
        slot_idx = torch.tensor(slot_ids).to(self.device, non_blocking=True)
        text_rows = torch.stack(text).to(self.device, self.tts_pad.dtype)
        out = self.graphs.run((slot_idx, text_rows), (window,)).cpu()  # the step's one copy
        outs = []
        for i, state in enumerate(states):
            self.cache.lengths[state.slot] += 1
            state.step += 1
            outs.append(StepOutput(outputs={"codes": out[i, :16]}, token=int(out[i, 16])))
        return outs

    def _admit(self, state: TalkerState, hidden: torch.Tensor) -> None:
        """Write a prefilled request's row of the slot table."""
        slot = state.slot
        self.slots.last_hidden[slot] = hidden[0]
        self.slots.admit(slot, self.cache.lengths[slot], state.rope_delta, state.sampling)

    def _scratch_inputs(
        self, inputs: tuple[torch.Tensor, ...], static: tuple[int, ...]
    ) -> tuple[torch.Tensor, ...]:
        """Inputs to capture a bucket on: every row on the spare slot, whose writes are
        harmless."""
        slot_idx, text_rows = inputs
        return torch.full_like(slot_idx, self.cache.spare_slot), torch.zeros_like(text_rows)
