"""A stage loads only its sub-model, with exactly the weights ``from_pretrained`` gives."""

from __future__ import annotations

import json

import pytest
import torch

from omni_serve.models.qwen2_5_omni.checkpoint import (
    load_speakers,
    load_talker,
    load_thinker_embeddings,
    load_token2wav,
)


def test_sub_models_load_the_weights_of_the_whole_model(tiny_model, tiny_qwen2_5_omni_path):
    talker, _ = load_talker(tiny_qwen2_5_omni_path)
    token2wav, _ = load_token2wav(tiny_qwen2_5_omni_path)
    for mine, theirs in ((talker, tiny_model.talker), (token2wav, tiny_model.token2wav)):
        ours, whole = mine.state_dict(), theirs.state_dict()
        assert ours.keys() == whole.keys()
        assert all(torch.equal(ours[k], whole[k]) for k in ours)
    embed = tiny_model.thinker.get_input_embeddings().weight
    assert torch.equal(load_thinker_embeddings(tiny_qwen2_5_omni_path), embed)
    speakers = load_speakers(tiny_qwen2_5_omni_path)
    assert sorted(speakers) == sorted(tiny_model.speaker_map)


def test_a_checkpoint_without_audio_output_says_what_to_do(tiny_qwen2_5_omni_path, tmp_path):
    for item in tiny_qwen2_5_omni_path.iterdir():
        (tmp_path / item.name).symlink_to(item)
    config = json.loads((tiny_qwen2_5_omni_path / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, "enable_audio_output": False}))
    with pytest.raises(ValueError, match="leave the talker and code2wav stages out"):
        load_talker(tmp_path)
