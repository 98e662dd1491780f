"""An encoder stage's rows spliced into the Thinker's prompt, and the identities that let a
session's KV prefix load only into a prompt with the same media."""

from __future__ import annotations

import pytest
import torch

from omni_serve.models.thinker_talker.thinker_inputs import splice_rows

AUDIO = 9
TABLE = torch.arange(10 * 4, dtype=torch.float32).reshape(10, 4)  # token id -> embedding


def test_rows_replace_the_placeholders_and_each_item_gets_its_offset_and_identity():
    ids = [1, AUDIO, AUDIO, 2, 3, AUDIO, AUDIO, AUDIO, 4]
    rows = torch.randn(5, 4)
    embeds, items = splice_rows(TABLE, ids, rows, AUDIO)
    assert torch.equal(embeds[[1, 2, 5, 6, 7]], rows)
    assert torch.equal(embeds[[0, 3, 4, 8]], TABLE[[1, 2, 3, 4]])
    assert [offset for offset, _ in items] == [1, 5]
    assert items[0][1] != items[1][1]

    # The same first item in a longer prompt: same identity; other rows: another.
    _, again = splice_rows(TABLE, [1, AUDIO, AUDIO, 5], rows[:2].clone(), AUDIO)
    assert again == [items[0]]
    _, other = splice_rows(TABLE, [1, AUDIO, AUDIO, 5], rows[:2] + 1, AUDIO)
    assert other[0][1] != items[0][1]


def test_a_row_count_that_does_not_fit_the_placeholders_is_refused():
    with pytest.raises(ValueError, match="3 media positions but 2 encoder rows"):
        splice_rows(TABLE, [AUDIO, AUDIO, AUDIO], torch.zeros(2, 4), AUDIO)


def test_bf16_rows_get_an_identity_too():
    _, items = splice_rows(TABLE, [AUDIO, 1], torch.ones(1, 4, dtype=torch.bfloat16), AUDIO)
    assert items[0][0] == 0 and items[0][1].startswith("rows:")
