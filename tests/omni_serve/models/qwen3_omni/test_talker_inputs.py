"""Which Thinker rows the Talker prompt needs: layer 0 anywhere is the token embedding table,
the accept layer only at media positions."""

from __future__ import annotations

import pytest
import torch

from omni_serve.models.qwen3_omni.family import FAMILY
from tests.reference import SPEAKER, media_layout


def _prompt(builder, run, embed_rows, accept_rows):
    return builder.build_prompt(
        run.prompt_ids,
        embed_rows,
        accept_rows,
        run.generated[0],
        SPEAKER,
        **media_layout(run.inputs),
    )


@pytest.mark.parametrize("kind", ["text", "audio", "image", "video"])
def test_layer_zero_rows_can_come_from_the_embedding_table(talker_parts, reference_runs, kind):
    run = reference_runs[kind]
    n = len(run.prompt_ids)
    embed, accept = run.hidden[0][:n], run.hidden[max(run.hidden)][:n]
    captured = _prompt(talker_parts[1], run, embed, accept)
    looked_up = _prompt(talker_parts[1], run, None, None if kind == "text" else accept)
    assert torch.equal(looked_up.embeds, captured.embeds)
    assert torch.equal(looked_up.position_ids, captured.position_ids)


@pytest.mark.parametrize("kind", ["audio", "image", "video"])
def test_a_prompt_with_media_needs_the_captured_rows(
    talker_parts, reference_runs, kind, tiny_omni_path
):
    run = reference_runs[kind]
    model = FAMILY.thinker_model(tiny_omni_path)
    assert model.capture_layers(run.prompt_ids) == (0, model.accept_layer)
    with pytest.raises(ValueError, match="needs the Thinker's captured rows"):
        _prompt(talker_parts[1], run, None, None)


def test_a_text_prompt_needs_no_captured_rows(reference_runs, tiny_omni_path):
    model = FAMILY.thinker_model(tiny_omni_path)
    assert model.capture_layers(reference_runs["text"].prompt_ids) == ()
