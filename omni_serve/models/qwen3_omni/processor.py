"""The Qwen3-Omni processor: Qwen3's tiny tokenizer with Qwen3-Omni's processor class."""

from __future__ import annotations

from pathlib import Path


def save_processor(directory: Path, vision_patch_size: int = 16) -> None:
    from transformers import Qwen3OmniMoeProcessor

    from omni_serve.models.common.omni_processor import save_omni_processor
    from omni_serve.models.common.qwen_tokenizer import build_tokenizer

    save_omni_processor(directory, Qwen3OmniMoeProcessor, build_tokenizer(), vision_patch_size)
