"""Per-slot request state on the device, for a decode step that runs as one static graph: a
row per KV-cache slot (the spare included) holding what the step reads and writes for that
request, so the step never asks the host (``device_sampling`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni_serve.engines.ar.device_sampling import RowSampling, fold_seed


@dataclass
class SlotTable:
    next_token: torch.Tensor  # [S] the token the next step consumes
    length: torch.Tensor  # [S] KV rows written
    rope_delta: torch.Tensor  # [S]
    seen: torch.Tensor  # [S, V] bool: tokens generated (repetition penalty)
    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_k: torch.Tensor  # [S] int64, <= 0 = off
    top_p: torch.Tensor  # [S] float32
    repetition_penalty: torch.Tensor  # [S] float32
    seed: torch.Tensor  # [S] int64 (32 bits)
    counter: torch.Tensor  # [S] int64: steps drawn so far

    @staticmethod
    def allocated(slots: int, vocab: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The fields, zeroed (top_p and the penalty at 1: off), for ``cls(**fields)``."""

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return {
            "next_token": zeros(slots),
            "length": zeros(slots),
            "rope_delta": zeros(slots),
            "seen": zeros(slots, vocab, dtype=torch.bool),
            "temperature": zeros(slots, dtype=torch.float32),
            "top_k": zeros(slots),
            "top_p": zeros(slots, dtype=torch.float32) + 1,
            "repetition_penalty": zeros(slots, dtype=torch.float32) + 1,
            "seed": zeros(slots),
            "counter": zeros(slots),
        }

    @classmethod
    def allocate(cls, slots: int, vocab: int, device: torch.device | str) -> SlotTable:
        return cls(**cls.allocated(slots, vocab, device))

    def rows(self, slot_idx: torch.Tensor) -> RowSampling:
        return RowSampling(
            temperature=self.temperature[slot_idx],
            top_k=self.top_k[slot_idx],
            top_p=self.top_p[slot_idx],
            seed=self.seed[slot_idx],
            counter=self.counter[slot_idx],
        )

    def admit(self, slot: int, length: int, rope_delta: int, sampling: Any) -> None:
        """A prefilled request's row: its KV length, RoPE offset and sampling settings (an
        unseeded request gets a seed from the host's RNG)."""
        seed = sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 1 << 32, ()))
        self.length[slot] = length
        self.rope_delta[slot] = rope_delta
        self.seen[slot] = False
        self.temperature[slot] = sampling.temperature
        self.top_k[slot] = sampling.top_k
        self.top_p[slot] = sampling.top_p
        self.repetition_penalty[slot] = sampling.repetition_penalty
        self.seed[slot] = fold_seed(seed)

    def took_first(self, slot_idx: torch.Tensor, token: torch.Tensor) -> None:
        """After prefill sampled each row's first token (draw 0)."""
        self.next_token[slot_idx] = token
        self.seen[slot_idx, token] = True
        self.counter[slot_idx] = 1
