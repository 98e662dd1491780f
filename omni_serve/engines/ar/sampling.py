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
    penalty or suppression). Row i equals ``sample_one(logits[i], config, [], None, gen_i)``:
    the masking is batched, only the draws stay per row (each request keeps its own RNG)."""
    logits = logits.float()
    if config.greedy:
        return torch.argmax(logits, dim=-1)
    logits = logits / config.temperature
    if config.top_k > 0:
        kth = torch.topk(logits, min(config.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = probs.cumsum(-1) - probs > config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.cat([
        torch.multinomial(probs[i], 1, generator=gen) for i, gen in enumerate(generators)
    ])  # fmt: skip
