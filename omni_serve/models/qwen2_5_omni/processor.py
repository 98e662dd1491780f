"""The Qwen2.5-Omni processor (the tiny tokenizer in Qwen2.5-Omni's layout, Whisper features,
Qwen2-VL image and video processors), built from parts and saved next to the weights, so that
``AutoProcessor.from_pretrained(checkpoint)`` works as it does for a real checkpoint."""

from __future__ import annotations

from pathlib import Path


def save_processor(directory: Path, vision_patch_size: int = 14) -> None:
    from omni_serve.compat import torchvision as tv_compat

    tv_compat.install()  # the video processor imports torchvision
    import transformers
    from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor

    from omni_serve.models.common.qwen_tokenizer import build_tokenizer
    from omni_serve.models.qwen2_5_omni.tokens import NAMED_TOKENS, SPECIAL_TOKENS

    tokenizer = build_tokenizer(SPECIAL_TOKENS, NAMED_TOKENS)
    vision = {"patch_size": vision_patch_size, "merge_size": 2, "temporal_patch_size": 2}
    processor = Qwen2_5OmniProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**vision),
        video_processor=transformers.Qwen2VLVideoProcessor(**vision),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(directory)
