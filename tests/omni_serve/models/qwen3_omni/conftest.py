"""Talker fixtures shared by the Qwen3-Omni tests."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.models.qwen3_omni.talker_static_runner import StaticTalkerRunner


@pytest.fixture(scope="session")
def talker_parts(tiny_omni_path):
    talker, config = load_talker(tiny_omni_path)
    return talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path))


def new_engine(talker_parts, max_batch_size: int = 4, step: str = "eager") -> TorchAREngine:
    """``step``: the eager ``TalkerRunner`` or the static-shape ``StaticTalkerRunner``."""
    talker, builder = talker_parts
    runner_cls = StaticTalkerRunner if step == "static" else TalkerRunner
    runner = runner_cls(talker, builder.tts_pad, max_batch_size=max_batch_size, max_len=1024)
    return TorchAREngine(runner, stop_token_ids=(runner.codec_eos_token_id,))
