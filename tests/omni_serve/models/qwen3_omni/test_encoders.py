"""The standalone encoders give exactly what the monolithic thinker computes."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.encoders.base import TorchEncoderEngine
from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
from tests.reference import processor_inputs


@pytest.fixture(scope="module")
def encoders(tiny_omni_path):
    return Qwen3OmniEncoders(tiny_omni_path)


async def test_audio_encoder_matches_thinker(encoders, hf_omni, omni_processor):
    """From the clip's samples: the encoder makes the features the processor makes."""
    from tests.reference import sample_audio

    inputs = processor_inputs(omni_processor, "audio")
    mask = inputs["feature_attention_mask"]
    with torch.no_grad():
        ref = hf_omni.thinker.get_audio_features(
            inputs["input_features"], feature_attention_mask=mask
        ).last_hidden_state
    engine = TorchEncoderEngine(encoders.encode_clips)
    out = await engine.encode(clips=[sample_audio()])
    engine.shutdown()
    assert out.meta["feature_lens"].tolist() == mask.sum(-1).tolist()
    assert out.embeds.shape[0] == int((inputs["input_ids"] == 332).sum())  # one row per pad
    torch.testing.assert_close(out.embeds, ref, atol=1e-5, rtol=0)


@torch.no_grad()
def test_vision_encoder_matches_thinker(encoders, hf_omni, omni_processor):
    inputs = processor_inputs(omni_processor, "image")
    ref = hf_omni.thinker.get_image_features(
        inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
    )
    out = TorchEncoderEngine(encoders.encode_image).encode_sync(
        pixel_values=inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]
    )
    torch.testing.assert_close(out.embeds, ref.pooler_output[0], atol=1e-5, rtol=0)
    assert len(out.deepstack) == len(ref.deepstack_features) > 0
    for mine, theirs in zip(out.deepstack, ref.deepstack_features, strict=True):
        torch.testing.assert_close(mine, theirs[0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_video_frames_encode_as_the_thinker_encodes_the_processors_patches(
    encoders, hf_omni, omni_processor
):
    """Frames patched in the encoder (with the whole processor's video bounds) give the rows
    the thinker computes from the processor's own video patches."""
    from tests.reference import sample_video

    inputs = processor_inputs(omni_processor, "video")
    ref = hf_omni.thinker.get_video_features(
        inputs["pixel_values_videos"], video_grid_thw=inputs["video_grid_thw"]
    )
    out = TorchEncoderEngine(encoders.encode_videos).encode_sync(
        videos=[torch.from_numpy(sample_video())]
    )
    assert out.meta["grid_thw"].tolist() == inputs["video_grid_thw"].tolist()
    torch.testing.assert_close(out.embeds, ref.pooler_output[0], atol=1e-5, rtol=0)
    for mine, theirs in zip(out.deepstack, ref.deepstack_features, strict=True):
        torch.testing.assert_close(mine, theirs[0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_images_patched_in_the_encoder_encode_as_the_thinker_encodes_the_processors_patches(
    encoders, hf_omni, omni_processor
):
    from tests.reference import sample_image

    inputs = processor_inputs(omni_processor, "image")
    ref = hf_omni.thinker.get_image_features(
        inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
    )
    out = encoders.encode_images([sample_image()])
    assert out.meta["grid_thw"].tolist() == inputs["image_grid_thw"].tolist()
    torch.testing.assert_close(out.embeds, ref.pooler_output[0], atol=1e-5, rtol=0)
