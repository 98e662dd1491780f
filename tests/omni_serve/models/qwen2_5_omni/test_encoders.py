"""Qwen2.5-Omni's standalone encoders give what transformers' Thinker computes, from the media
themselves: a clip's samples (featurized as its processor does, padded to 30 s), an image's
pixels, a video's frames."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor

from omni_serve.models.qwen2_5_omni.encoders import Qwen25OmniEncoders
from tests.reference import processor_inputs, sample_audio, sample_image, sample_video


@pytest.fixture(scope="module")
def encoders(tiny_qwen2_5_omni_path):
    return Qwen25OmniEncoders(tiny_qwen2_5_omni_path)


@pytest.fixture(scope="module")
def processor(tiny_qwen2_5_omni_path):
    return AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)


@torch.no_grad()
def test_a_clip_encodes_as_the_thinker_encodes_the_processors_features(
    encoders, tiny_model, processor
):
    inputs = processor_inputs(processor, "audio")
    mask = inputs["feature_attention_mask"]
    ref = tiny_model.thinker.get_audio_features(
        inputs["input_features"], feature_attention_mask=mask
    ).last_hidden_state
    out = encoders.encode_clips([sample_audio()])
    assert out.meta["feature_lens"].tolist() == mask.sum(-1).tolist()
    audio_pad = tiny_model.config.thinker_config.audio_token_index
    assert out.embeds.shape[0] == int((inputs["input_ids"] == audio_pad).sum())
    assert encoders.clip_rows(out.meta["feature_lens"]).tolist() == [out.embeds.shape[0]]
    torch.testing.assert_close(out.embeds, ref, atol=1e-5, rtol=0)


@torch.no_grad()
def test_an_unpadded_clips_features_would_differ_at_its_end(encoders, processor):
    """Why the features are padded first: the processor's STFT sees zeros past a clip's end."""
    from omni_serve.models.thinker_talker.thinker_inputs import clip_features

    padded = encoders.clip_features(sample_audio())
    unpadded = clip_features(processor.feature_extractor, sample_audio())
    assert padded.shape == unpadded.shape
    assert not torch.equal(padded, unpadded)


@torch.no_grad()
def test_an_image_encodes_as_the_thinker_encodes_the_processors_patches(
    encoders, tiny_model, processor
):
    inputs = processor_inputs(processor, "image")
    ref = tiny_model.thinker.get_image_features(
        inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
    )
    out = encoders.encode_images([sample_image()])
    assert out.meta["grid_thw"].tolist() == inputs["image_grid_thw"].tolist()
    assert out.deepstack == []
    torch.testing.assert_close(out.embeds, ref.pooler_output[0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_video_frames_encode_as_the_thinker_encodes_the_processors_patches(
    encoders, tiny_model, processor
):
    inputs = processor_inputs(processor, "video")
    ref = tiny_model.thinker.get_video_features(
        inputs["pixel_values_videos"], video_grid_thw=inputs["video_grid_thw"]
    )
    out = encoders.encode_videos([torch.from_numpy(sample_video())])
    assert out.meta["grid_thw"].tolist() == inputs["video_grid_thw"].tolist()
    torch.testing.assert_close(out.embeds, ref.pooler_output[0], atol=1e-5, rtol=0)
