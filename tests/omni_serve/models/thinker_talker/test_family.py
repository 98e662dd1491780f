"""Each Thinker-Talker family loads its Talker and codec behind one interface, as the stage
deployments ask for them (by the pipeline config's ``family``)."""

from __future__ import annotations

import pytest
import torch

from graphs.pipeline_paths import REPO
from omni_serve.config import load_pipeline_config
from omni_serve.models import resolve_model
from omni_serve.models.registry import thinker_talker_family

PIPELINES = {"qwen3_omni": "qwen3_omni_tiny.yaml", "qwen2_5_omni": "qwen2_5_omni_tiny.yaml"}


def pipeline(family: str):
    config = load_pipeline_config(REPO / "configs" / "pipelines" / PIPELINES[family])
    return config, resolve_model(config.model)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_talker_and_codec_load_through_the_family(name):
    config, path = pipeline(name)
    family = thinker_talker_family(config.family)
    talker = family.load_talker(
        path, torch.float32, "cpu", config.stage("talker").engine, max_len=512
    )
    assert talker.runner.max_batch_size == config.stage("talker").engine.max_batch_size
    assert talker.stop_token_ids and talker.sampling_defaults["repetition_penalty"] == 1.05
    assert talker.feed.tokens_are_frames == talker.feed.reads_reply_rows == (name != "qwen3_omni")
    decoder, info = family.load_codec(path, torch.float32, "cpu", config.stage("code2wav").engine)
    assert decoder.samples_per_frame == info.samples_per_frame > 0


def test_an_unknown_family_is_named():
    with pytest.raises(KeyError, match="qwen_image"):
        thinker_talker_family("qwen_image")


def test_the_qwen2_5_talker_takes_cuda_graphs_as_its_static_step():
    """``cuda_graphs`` reaches the family's static runner, which needs a GPU to capture on."""
    config, path = pipeline("qwen2_5_omni")
    engine = config.stage("talker").engine.model_copy(update={"cuda_graphs": True})
    with pytest.raises(ValueError, match="needs CUDA"):
        thinker_talker_family("qwen2_5_omni").load_talker(path, torch.float32, "cpu", engine, 64)


def test_the_qwen2_5_thinker_captures_its_last_layer_for_every_prompt():
    """Its Talker reads the last layer everywhere, text prompts included."""
    _, path = pipeline("qwen2_5_omni")
    model = thinker_talker_family("qwen2_5_omni").thinker_model(path)
    assert model.reply_layer == model.accept_layer == 2  # the tiny Thinker's 2 layers
    assert model.capture_layers([1, 2, 3]) == (2,)
    assert set(model.placeholders) == {"audio", "image", "video"}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_voices_are_the_api_values(name):
    config, path = pipeline(name)
    voices = thinker_talker_family(name).voices(path)
    assert "ethan" in voices and voices == sorted(v.lower() for v in voices)


def test_every_familys_codec_speaks_at_the_shared_rate():
    """The API and Realtime encode every family's replies at ``SAMPLE_RATE``."""
    from omni_serve.models.qwen2_5_omni import token2wav
    from omni_serve.models.qwen3_omni import codec
    from omni_serve.models.thinker_talker.family import SAMPLE_RATE

    assert codec.SAMPLE_RATE == token2wav.SAMPLE_RATE == SAMPLE_RATE


@pytest.mark.parametrize("family", ["qwen3_omni", "qwen2_5_omni"])
def test_the_encoder_stage_loads_its_towers_through_the_family(family):
    """Each family's towers behind the item cache: a clip's rows, then the cache's."""
    _, path = pipeline(family)
    encoders = thinker_talker_family(family).load_encoders(
        path, torch.float32, "cpu", cache_bytes=1 << 20
    )
    clip = torch.sin(torch.arange(16000) / 16000 * 2 * torch.pi * 440)
    with torch.no_grad():
        [rows] = encoders.audio(clip, [len(clip)])
        [again] = encoders.audio(clip, [len(clip)])
    assert rows.ndim == 2 and rows.shape[0] > 0 and torch.equal(again, rows)
    assert encoders.cache.stats()["misses"] == 1 and encoders.cache.stats()["hits"] == 1
