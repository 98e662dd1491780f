"""The slot table's row for a request: admission rewrites every field a former request left,
an unseeded request still gets a seed (so its draws are the hash's, not all alike), and the
first token counts as drawn and seen."""

from __future__ import annotations

import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.engines.ar.device_sampling import fold_seed
from omni_serve.engines.ar.slot_table import SlotTable


def test_admission_rewrites_the_row_and_the_first_token_counts():
    table = SlotTable.allocate(3, vocab=10, device="cpu")
    table.seen[1, 4], table.counter[1] = True, 7  # what a former request left
    seeded = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.1, seed=3)
    table.admit(1, length=12, rope_delta=-2, sampling=seeded)
    assert not table.seen[1].any()
    assert (int(table.length[1]), int(table.rope_delta[1]), int(table.seed[1])) == (
        12,
        -2,
        fold_seed(3),
    )
    rows = table.rows(torch.tensor([1]))
    assert torch.allclose(rows.temperature, torch.tensor([0.7])) and int(rows.top_k[0]) == 5
    table.took_first(torch.tensor([1]), torch.tensor([6]))
    assert int(table.next_token[1]) == 6 and bool(table.seen[1, 6]) and int(table.counter[1]) == 1
    assert table.length[0] == 0 and not table.seen[0].any()  # other rows untouched


def test_unseeded_requests_get_different_seeds():
    table = SlotTable.allocate(3, vocab=10, device="cpu")
    torch.manual_seed(0)
    for slot in range(3):
        table.admit(slot, length=1, rope_delta=0, sampling=SamplingConfig(temperature=1.0))
    assert len(set(table.seed.tolist())) == 3
