"""An encoder stage's rows spliced into the Thinker's prompt, and the identities that let a
session's KV prefix load only into a prompt with the same media."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.thinker_talker import thinker_inputs
from omni_serve.models.thinker_talker.messages import ThinkerRequest
from omni_serve.models.thinker_talker.thinker_inputs import checked_rows, splice_rows

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


@pytest.mark.parametrize("modality", ["image", "video"])
def test_encoded_rows_that_do_not_fit_their_grids_are_refused_before_the_engine(modality):
    grid = [[1, 4, 6], [2, 2, 4]]  # 6 + 4 rows at merge size 2
    rows = torch.randn(10, 8)
    assert checked_rows(rows, grid, 2, modality) is rows
    for wrong in (torch.randn(9, 8), torch.randn(11, 8), torch.randn(10)):
        with pytest.raises(ValueError, match=f"{modality} rows have shape .* make 10 rows"):
            checked_rows(wrong, grid, 2, modality)


async def test_the_thinkers_inputs_refuse_image_rows_that_do_not_fit_their_grid(monkeypatch):
    taken = {"good": torch.randn(6, 8), "short": torch.randn(5, 8)}

    async def take(ref):
        return taken[ref]

    monkeypatch.setattr(thinker_inputs, "take", take)
    request = ThinkerRequest("r1", [1, 2, 3], SamplingConfig(), image_grid_thw=[[1, 4, 6]])
    request.image_rows = "good"
    inputs = await thinker_inputs.engine_inputs(request, TABLE, AUDIO, 2)
    assert inputs.multi_modal_data["image"]["image_embeds"] is taken["good"]
    request.image_rows = "short"
    with pytest.raises(ValueError, match="make 6 rows"):
        await thinker_inputs.engine_inputs(request, TABLE, AUDIO, 2)
