"""Token sampling for the torch engine, matching transformers' logits processors in order:
repetition penalty, suppressed tokens, temperature, top-k, top-p, then argmax or a draw."""

from __future__ import annotations

import torch

from omni_serve.engines.ar.base import SamplingConfig


def apply_repetition_penalty(logits: torch.Tensor, seen: list[int], penalty: float) -> None:
    if penalty == 1.0 or not seen:
        return
    idx = torch.tensor(sorted(set(seen)), dtype=torch.long)
    scores = logits[idx]
    logits[idx] = torch.where(scores < 0, scores * penalty, scores / penalty)


def sample_one(
    logits: torch.Tensor,
    config: SamplingConfig,
    seen: list[int],
    suppress: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> int:
    """Pick one token from a [V] row of logits (float32)."""
    logits = logits.float().clone()
    apply_repetition_penalty(logits, seen, config.repetition_penalty)
    if suppress is not None and suppress.numel():
        logits[suppress] = float("-inf")
    return int(sample_rows(logits[None], config, [generator])[0])


def sample_rows(
    logits: torch.Tensor,
    config: SamplingConfig,
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row of [B, V] logits, all rows under the same ``config`` (no repetition
    penalty or suppression). Row i equals ``sample_one(logits[i], config, [], None, gen_i)``
    for seeded rows: the masking is batched, only seeded draws stay per row (each such request
    keeps its own RNG); unseeded rows share one draw from the global RNG.

    Top-k keeps exactly k candidates (ties at the k-th value are broken by ``topk``) and the
    rest of the work runs on those k columns: over the full vocabulary, sorting and drawing
    were a third of a batched Talker step."""
    logits = logits.float()
    if config.greedy:
        return torch.argmax(logits, dim=-1)
    logits = logits / config.temperature
    ids = None
    if 0 < config.top_k < logits.shape[-1]:
        logits, ids = torch.topk(logits, config.top_k, dim=-1)  # sorted, descending
    if config.top_p < 1.0:
        if ids is None:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        else:
            sorted_logits, order = logits, None
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > config.top_p
        if order is not None:
            drop = torch.zeros_like(drop).scatter(-1, order, drop)
        logits = logits.masked_fill(drop, float("-inf"))
    picks = _draw(torch.softmax(logits, dim=-1), generators)
    return picks if ids is None else ids.gather(-1, picks[:, None])[:, 0]


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    picks = torch.empty(len(generators), dtype=torch.long)
    shared = [i for i, gen in enumerate(generators) if gen is None]
    if shared:
        picks[shared] = torch.multinomial(probs[shared], 1)[:, 0]
    for i, gen in enumerate(generators):
        if gen is not None:
            picks[i] = torch.multinomial(probs[i], 1, generator=gen)[0]
    return picks
