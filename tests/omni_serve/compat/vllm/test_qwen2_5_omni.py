"""vLLM's Qwen2.5-Omni Thinker places a heard video's M-RoPE positions as transformers does,
whether the heard span ends in frames (a track shorter than the video) or in sound (longer)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import AutoProcessor, Qwen2_5OmniForConditionalGeneration
from vllm.model_executor.models.qwen2_5_omni_thinker import (
    Qwen2_5OmniThinkerForConditionalGeneration,
)
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

from omni_serve.compat.vllm.qwen2_5_omni import Qwen2_5OmniThinkerForServing
from tests.reference import processor_inputs


def long_track() -> np.ndarray:
    """5 s of sound under the 3 s sample video: the heard span's last chunk is sound."""
    t = np.arange(16000 * 5) / 16000
    return (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)


@pytest.fixture(scope="module", params=["ends_in_frames", "ends_in_sound"])
def heard_video(request, tiny_qwen2_5_omni_path):
    """A text + heard-video prompt: its ids, transformers' positions, vLLM's features."""
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    track = long_track() if request.param == "ends_in_sound" else None
    inputs = processor_inputs(processor, "video_audio", track)
    thinker = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).thinker
    config = thinker.config
    seqlens = inputs["feature_attention_mask"].sum(-1)
    expected, _ = thinker.get_rope_index(
        inputs["input_ids"],
        None,
        inputs["video_grid_thw"],
        inputs["attention_mask"],
        True,
        seqlens,
        inputs["video_second_per_grid"],
    )
    ids = inputs["input_ids"][0]
    bos = int((ids == config.audio_start_token_id).nonzero()[0])
    span = int(((ids == config.video_token_id) | (ids == config.audio_token_id)).sum())
    last = config.audio_token_id if request.param == "ends_in_sound" else config.video_token_id
    assert int(ids[bos + span]) == last, "the prompt does not end its span as the case says"

    def feature(modality: str, offset: int, **data: torch.Tensor) -> MultiModalFeatureSpec:
        items = {k: SimpleNamespace(data=v) for k, v in data.items()}
        return MultiModalFeatureSpec(items, modality, modality, PlaceholderRange(offset, span + 2))

    features = [
        feature(
            "video",
            bos,
            video_grid_thw=inputs["video_grid_thw"][0],
            second_per_grid_ts=inputs["video_second_per_grid"][0],
            use_audio_in_video=torch.tensor(True),
        ),
        feature("audio", bos + 1, audio_feature_lengths=seqlens[0]),
    ]
    return ids.tolist(), expected[:, 0], features, config


def positions(cls, heard_video) -> tuple[torch.Tensor, int]:
    ids, _, features, config = heard_video
    model = object.__new__(cls)  # the position rule reads only the config
    model.__dict__["config"] = config
    return model.get_mrope_input_positions(ids, features)


def test_a_heard_videos_positions_are_transformers(heard_video):
    ids, expected, _, _ = heard_video
    got, delta = positions(Qwen2_5OmniThinkerForServing, heard_video)
    assert torch.equal(got, expected)
    assert delta == int(expected.max()) + 1 - len(ids)


def test_upstream_places_them_otherwise(heard_video):
    """Guards the compat: when vLLM gets this right, the override can go."""
    _, expected, _, _ = heard_video
    got, _ = positions(Qwen2_5OmniThinkerForConditionalGeneration, heard_video)
    assert got.shape == expected.shape and not torch.equal(got, expected)
