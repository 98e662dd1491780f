from __future__ import annotations

import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.engines.ar.kv_cache import SlotKVCache
from omni_serve.engines.ar.sampling import sample_one


def test_greedy_with_penalty_and_suppression():
    logits = torch.tensor([1.0, 3.0, 2.9, -1.0])
    assert sample_one(logits, SamplingConfig(), []) == 1
    # penalty 1.1 on token 1: 3.0/1.1 < 2.9
    assert sample_one(logits, SamplingConfig(repetition_penalty=1.1), [1]) == 2
    assert sample_one(logits, SamplingConfig(), [], suppress=torch.tensor([1, 2])) == 0


def test_sampling_is_seeded_and_respects_top_k():
    logits = torch.zeros(100)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    logits[:3] = 5.0
    draws = {
        sample_one(logits, cfg, [], generator=torch.Generator().manual_seed(i)) for i in range(50)
    }
    assert draws <= {0, 1, 2}
    a = sample_one(logits, cfg, [], generator=torch.Generator().manual_seed(7))
    assert a == sample_one(logits, cfg, [], generator=torch.Generator().manual_seed(7))


def test_slot_cache_masks_each_row_to_its_own_length():
    cache = SlotKVCache(num_layers=1, num_slots=2, num_kv_heads=1, head_dim=2, max_len=8)
    a, b = cache.allocate(), cache.allocate()
    cache.append(0, [a], torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.advance([a], 3)
    _, _, mask = cache.append(0, [a, b], torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))
    cache.advance([a, b], 1)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[0, 0, 0].tolist() == [True, True, True, True]
    assert mask[1, 0, 0].tolist() == [True, False, False, False]
    cache.release(a)
    assert cache.free_slots == 1 and cache.lengths[a] == 0


def test_batched_rows_equal_one_at_a_time():
    from omni_serve.engines.ar.sampling import sample_rows

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 3
    for cfg in (
        SamplingConfig(),
        SamplingConfig(temperature=1.0, top_k=50, top_p=0.8),
        SamplingConfig(temperature=0.7, top_p=0.5),
    ):
        gens_a = [torch.Generator().manual_seed(10 + i) for i in range(5)]
        gens_b = [torch.Generator().manual_seed(10 + i) for i in range(5)]
        batched = sample_rows(logits, cfg, gens_a).tolist()
        single = [sample_one(logits[i], cfg, [], None, gens_b[i]) for i in range(5)]
        assert batched == single


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([4.0, 3.0, 0.0, -1.0])  # probs ~ 0.71, 0.26, 0.01, 0.005
    cfg = SamplingConfig(temperature=1.0, top_p=0.8)
    draws = {
        sample_one(logits, cfg, [], generator=torch.Generator().manual_seed(i)) for i in range(200)
    }
    assert draws == {0, 1}
    assert sample_one(logits, SamplingConfig(temperature=1.0, top_p=0.5), []) == 0


def test_unseeded_rows_share_one_draw_and_keep_to_top_k():
    from omni_serve.engines.ar.sampling import sample_rows

    logits = torch.zeros(4, 100)
    logits[:, 10:13] = 5.0
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    draws = {t for _ in range(30) for t in sample_rows(logits, cfg, [None] * 4).tolist()}
    assert draws <= {10, 11, 12} and len(draws) > 1
