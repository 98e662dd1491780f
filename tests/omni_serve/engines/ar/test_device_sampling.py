"""The on-device sampler: the distribution it draws from, its filters, and that a draw is a
pure function of (seed, counter, stream), so it replays in a graph and ignores the batch."""

from __future__ import annotations

import torch

from omni_serve.engines.ar.device_sampling import (
    RowSampling,
    apply_repetition_penalty,
    fold_seed,
    gumbel,
    sample,
    sample_fixed,
    uniform,
    uniform_streams,
    unit_interval,
)


def rows(n: int, temperature=1.0, top_k=0, top_p=1.0, seed=None, counter=0) -> RowSampling:
    seeds = torch.arange(n) if seed is None else torch.full((n,), seed)
    return RowSampling(
        temperature=torch.full((n,), float(temperature)),
        top_k=torch.full((n,), top_k),
        top_p=torch.full((n,), float(top_p)),
        seed=seeds,
        counter=torch.full((n,), counter),
    )


def test_uniforms_are_in_the_open_unit_interval_and_evenly_spread():
    u = uniform(torch.arange(64), torch.zeros(64, dtype=torch.int64), 0, 4096)
    assert float(u.min()) > 0 and float(u.max()) < 1
    counts = torch.histc(u, bins=10, min=0, max=1)
    assert float(counts.min()) > 0.9 * u.numel() / 10  # each decile within 10% of even


def test_the_extreme_hashes_stay_strictly_inside_the_unit_interval():
    """A 1.0 would make the Gumbel noise infinite and pick its column whatever the filters."""
    u = unit_interval(torch.tensor([0, 0xFFFFFFFF]))
    assert float(u[0]) > 0 and float(u[1]) < 1


def test_a_draw_depends_on_seed_counter_and_stream_only():
    seed, counter = torch.tensor([fold_seed(7)]), torch.tensor([3])
    same = uniform(seed, counter, 2, 16)
    assert torch.equal(same, uniform(seed, counter, 2, 16))
    assert not torch.equal(same, uniform(seed, counter + 1, 2, 16))
    assert not torch.equal(same, uniform(seed, counter, 3, 16))
    assert not torch.equal(same, uniform(seed + 1, counter, 2, 16))


def test_the_hash_is_pinned_so_a_seed_gives_the_same_speech_across_versions():
    """The 23-bit draws of two requests, as this hash has made them since it was written: a
    seeded reply must not change with an upgrade."""
    seed = torch.tensor([fold_seed(7), fold_seed(123456789)])
    bits = uniform(seed, torch.tensor([0, 41]), 3, 4).mul(1 << 23).sub(0.5)
    assert bits.tolist() == [
        [3464221.0, 761736.0, 6090758.0, 1251601.0],
        [2201465.0, 7214435.0, 2244063.0, 2279506.0],
    ]


def test_a_steps_streams_hashed_at_once_are_each_streams_own_draws():
    seed, counter = torch.tensor([fold_seed(7), fold_seed(8)]), torch.tensor([5, 0])
    at_once = uniform_streams(seed, counter, 1, 15, 50)
    for j in range(15):
        assert torch.equal(at_once[:, j], uniform(seed, counter, j + 1, 50))


def test_draws_follow_softmax_of_logits_over_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 20000
    picks = sample(logits.expand(n, -1).clone(), rows(n, temperature=0.7), stream=0)
    freq = torch.bincount(picks, minlength=4).float() / n
    expected = torch.softmax(logits / 0.7, dim=-1)
    assert torch.allclose(freq, expected, atol=0.015), (freq, expected)


def test_greedy_rows_take_the_argmax_and_top_k_one_is_greedy():
    logits = torch.randn(8, 50)
    assert torch.equal(sample(logits, rows(8, temperature=0.0), 0), logits.argmax(-1))
    assert torch.equal(sample(logits, rows(8, temperature=5.0, top_k=1), 0), logits.argmax(-1))


def test_top_k_and_top_p_never_pick_outside_what_they_keep():
    logits = torch.tensor([3.0, 2.9, 0.0, -1.0, -2.0])
    n = 4000
    top_k = sample(logits.expand(n, -1).clone(), rows(n, temperature=2.0, top_k=2), 0)
    assert set(top_k.tolist()) == {0, 1}
    # softmax: ~[0.50, 0.45, 0.03, ...]; top_p 0.9 keeps the first two (0.50 < 0.9 <= 0.95).
    top_p = sample(logits.expand(n, -1).clone(), rows(n, top_p=0.9), 0)
    assert set(top_p.tolist()) == {0, 1}


def test_a_row_draws_the_same_token_alone_or_in_any_batch():
    logits = torch.randn(6, 100)
    settings = rows(6, temperature=0.9, top_k=20)
    batch = sample(logits, settings, stream=4)
    for i in range(6):
        alone = RowSampling(*(t[i : i + 1] for t in settings.__dict__.values()))
        assert int(sample(logits[i : i + 1], alone, stream=4)[0]) == int(batch[i])
    reordered = sample(
        logits.flip(0), RowSampling(*(t.flip(0) for t in settings.__dict__.values())), 4
    )
    assert torch.equal(reordered.flip(0), batch)


def test_fixed_settings_match_per_row_settings_in_distribution():
    logits = torch.randn(1, 300)
    n = 20000
    seed, counter = torch.arange(n), torch.zeros(n, dtype=torch.int64)
    fixed = sample_fixed(
        logits.expand(n, -1).clone(),
        torch.zeros(n, dtype=torch.bool),
        gumbel(seed, counter, 1, 50),
        temperature=1.0,
        top_k=50,
        top_p=0.8,
    )
    per_row = sample(logits.expand(n, -1).clone(), rows(n, top_k=50, top_p=0.8), 1)
    kept = set(torch.topk(logits[0], 50).indices.tolist())
    assert set(fixed.tolist()) <= kept and set(per_row.tolist()) <= kept
    a = torch.bincount(fixed, minlength=300).float() / n
    b = torch.bincount(per_row, minlength=300).float() / n
    assert float((a - b).abs().sum()) < 0.1  # total variation distance under 0.05


def test_repetition_penalty_lowers_seen_tokens_either_sign():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]
