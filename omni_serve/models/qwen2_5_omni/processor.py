"""The Qwen2.5-Omni processor: the tiny tokenizer in Qwen2.5-Omni's token layout with its
processor class."""

from __future__ import annotations

from pathlib import Path


def save_processor(directory: Path, vision_patch_size: int = 14) -> None:
    from transformers import Qwen2_5OmniProcessor

    from omni_serve.models.common.omni_processor import save_omni_processor
    from omni_serve.models.common.qwen_tokenizer import build_tokenizer
    from omni_serve.models.qwen2_5_omni.tokens import NAMED_TOKENS, SPECIAL_TOKENS

    tokenizer = build_tokenizer(SPECIAL_TOKENS, NAMED_TOKENS)
    save_omni_processor(directory, Qwen2_5OmniProcessor, tokenizer, vision_patch_size)
