"""The tiny Qwen2.5-Omni model and its reference runs, shared by this family's tests."""

from __future__ import annotations

import pytest
from transformers import AutoProcessor, Qwen2_5OmniForConditionalGeneration

from tests.reference_qwen2_5_omni import reference_run

KINDS = ("text", "audio", "image", "video", "video_audio")


@pytest.fixture(scope="session")
def tiny_model(tiny_qwen2_5_omni_path):
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).eval()


@pytest.fixture(scope="session")
def reference_runs(tiny_model, tiny_qwen2_5_omni_path):
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    return {kind: reference_run(tiny_model, processor, kind) for kind in KINDS}
