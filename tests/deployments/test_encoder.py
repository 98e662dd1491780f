"""The encoder stage writes its rows into channel memory: the same rows torch.cat would give,
as float32 on the host."""

from __future__ import annotations

import torch

from deployments.encoder import _like
from omni_serve.transport import make_channel, take
from omni_serve.transport.base import cat_into, put_in_place


async def test_image_rows_with_deepstack_levels_arrive_as_their_concatenation_in_float32():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(5, 8, generator=gen).to(torch.bfloat16) for _ in range(4)]
    like = _like(parts[0], width=32)
    assert like.shape == (5, 32) and like.dtype == torch.float32
    ref = put_in_place(
        make_channel("shared_memory"), like, lambda rows: cat_into(rows, parts, dim=-1)
    )
    assert torch.equal(await take(ref), torch.cat(parts, dim=-1).float())
