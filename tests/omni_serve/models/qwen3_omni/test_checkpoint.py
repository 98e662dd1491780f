"""Loading stages from a checkpoint directory."""

from __future__ import annotations

import json
import shutil

import pytest

from omni_serve.models.qwen3_omni.checkpoint import load_talker


def test_a_checkpoint_without_a_talker_says_to_serve_it_in_text(tiny_omni_path, tmp_path):
    """As the Thinking and Captioner checkpoints' config says (enable_audio_output false)."""
    shutil.copy(tiny_omni_path / "config.json", tmp_path / "config.json")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "enable_audio_output": False}))
    with pytest.raises(ValueError, match="has no Talker .* leave the talker and code2wav"):
        load_talker(tmp_path)
