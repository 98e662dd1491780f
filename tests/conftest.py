"""Shared fixtures: tiny checkpoints are built once per session (cached on disk after that),
and the expensive transformers references are computed once and shared."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import omni_serve  # noqa: E402,F401  (torchvision compat before transformers)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def exact_float32():
    """float32 matmuls and convolutions in float32 (not TF32) on a GPU, so a stage's GPU
    outputs compare with its CPU ones at 1e-4."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="session")
def tiny_omni_path():
    from omni_serve.models import ensure_model

    return ensure_model("tiny-qwen3-omni")


@pytest.fixture(scope="session")
def tiny_qwen2_5_omni_path():
    from omni_serve.models import ensure_model

    return ensure_model("tiny-qwen2-5-omni")


@pytest.fixture(scope="session")
def tiny_image_path():
    from omni_serve.models import ensure_model

    return ensure_model("tiny-qwen-image")


@pytest.fixture(scope="session")
def hf_omni(tiny_omni_path):
    """transformers' own Qwen3-Omni on the tiny checkpoint: the reference implementation."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from omni_serve.compat.transformers import qwen3_omni_talker_audio_config

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_omni_path).eval()
    qwen3_omni_talker_audio_config(model.talker, model.config.thinker_config)
    return model


@pytest.fixture(scope="session")
def omni_processor(tiny_omni_path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_omni_path)


@pytest.fixture(scope="session")
def reference_runs(hf_omni, omni_processor):
    """transformers' greedy text + codes + waveform for text, audio, image, audio+image,
    video, and video heard with its audio track."""
    from tests.reference import reference_run

    kinds = ("text", "audio", "image", "mixed", "video", "video_audio")
    return {kind: reference_run(hf_omni, omni_processor, kind) for kind in kinds}
