"""Token sampling that stays on the device and in a static graph.

``sampling.py`` draws on the host with one ``torch.Generator`` per request: right for the
engine's eager loop, impossible inside a CUDA graph (a graph replays fixed kernels; a
per-request generator and a ``.item()`` per row are host work). Here every row's settings are
tensors, and the randomness is a counter-based hash of (seed, counter, stream, column): a draw
is a pure function of its inputs, so it replays inside a graph, gives the same token on any
batch composition, and needs no RNG state beyond a per-request step counter.

The draw is the Gumbel-max trick (argmax of logits / temperature plus Gumbel noise), which
samples exactly from softmax(logits / temperature) over the columns left after top-k and
top-p. The filters match ``sampling.py``'s order: repetition penalty, suppressed tokens,
temperature, top-k, top-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_MUL = 0x045D9F3B  # < 2**27: a 32-bit value times it stays within int64


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) on int64 lanes holding 32 bits."""
    x = ((x ^ (x >> 16)) * _MUL) & _MASK32
    x = ((x ^ (x >> 16)) * _MUL) & _MASK32
    return x ^ (x >> 16)


def fold_seed(seed: int) -> int:
    """A request's seed (any int) as the 32 bits the hash takes."""
    seed &= (1 << 64) - 1
    return (seed ^ (seed >> 32)) & _MASK32


def uniform(seed: torch.Tensor, counter: torch.Tensor, stream: int, width: int) -> torch.Tensor:
    """[B, width] float32 in (0, 1): column c of row b is a hash of (seed[b], counter[b],
    stream, c). ``stream`` separates the draws of one step (a frame's 16 code groups)."""
    return uniform_streams(seed, counter, stream, 1, width)[:, 0]


def uniform_streams(
    seed: torch.Tensor, counter: torch.Tensor, first: int, count: int, width: int
) -> torch.Tensor:
    """[B, count, width]: ``uniform`` for streams ``first .. first + count - 1`` at once, the
    same values, in one hash's kernels instead of one per stream (a launch-bound graph's
    count matters more than its arithmetic)."""
    streams = torch.arange(first, first + count, device=seed.device, dtype=torch.int64)
    row = _mix32((seed[:, None] ^ _mix32(counter[:, None] * 64 + streams)) & _MASK32)  # [B, S]
    cols = torch.arange(width, device=seed.device, dtype=torch.int64)
    return unit_interval(_mix32((row[..., None] + cols * 0x9E3779B1) & _MASK32))


def unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hashes as float32 strictly inside (0, 1)."""
    # 23 bits: (2**23 - 0.5) / 2**23 is below 1 in float32 (with 24, the top one rounds to 1.0
    # and its Gumbel noise is infinite).
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def gumbel(seed: torch.Tensor, counter: torch.Tensor, stream: int, width: int) -> torch.Tensor:
    return to_gumbel(uniform(seed, counter, stream, width))


def to_gumbel(uniform: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform))


@dataclass
class RowSampling:
    """Per-row sampling settings as [B] tensors (gathered from a slot table each step)."""

    temperature: torch.Tensor  # float32; 0 = greedy
    top_k: torch.Tensor  # int64; <= 0 = off
    top_p: torch.Tensor  # float32; 1 = off
    seed: torch.Tensor  # int64, 32 bits (fold_seed)
    counter: torch.Tensor  # int64: the request's draws so far (a new one each step)


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """transformers' penalty on the tokens a row has generated (``seen``: [B, V] bool)."""
    scaled = torch.where(logits < 0, logits * penalty[:, None], logits / penalty[:, None])
    return torch.where(seen, scaled, logits)


def sample(logits: torch.Tensor, rows: RowSampling, stream: int) -> torch.Tensor:
    """One token per row of [B, V] float32 logits (penalties and suppression already applied):
    argmax where temperature is 0, else a draw over what top-k and top-p leave. The work runs
    on the logits sorted once; a rank past a row's top-k or past its top-p mass is dropped."""
    greedy = rows.temperature <= 0
    temperature = torch.where(greedy, torch.ones_like(rows.temperature), rows.temperature)
    scaled, order = torch.sort(logits / temperature[:, None], dim=-1, descending=True, stable=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    top_k = torch.where(rows.top_k > 0, rows.top_k, logits.shape[-1])
    keep = rank < top_k[:, None]
    probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)
    keep &= (probs.cumsum(-1) - probs) <= rows.top_p[:, None]
    noise = gumbel(rows.seed, rows.counter, stream, logits.shape[-1])
    pick = torch.argmax(scaled.masked_fill(~keep, float("-inf")) + noise, dim=-1)
    drawn = order.gather(-1, pick[:, None])[:, 0]
    return torch.where(greedy, order[:, 0], drawn)


def sample_fixed(
    logits: torch.Tensor,
    greedy: torch.Tensor,
    noise: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
) -> torch.Tensor:
    """``sample`` for settings shared by every row (the code predictor's): top-k is one
    ``topk`` call and the rest runs on k columns. ``noise`` [B, top_k] is the rows' Gumbel
    noise for this draw (``to_gumbel`` of ``uniform_streams``: a caller that draws several
    times a step hashes them all at once). ``greedy`` rows take the argmax."""
    values, ids = torch.topk(logits / temperature, top_k, dim=-1)  # sorted, descending
    probs = torch.softmax(values, dim=-1)
    keep = (probs.cumsum(-1) - probs) <= top_p
    pick = torch.argmax(values.masked_fill(~keep, float("-inf")) + noise, dim=-1)
    return torch.where(greedy, ids[:, 0], ids.gather(-1, pick[:, None])[:, 0])
