"""The Qwen3-Omni processor (tokenizer + Whisper features + Qwen2-VL image/video processors).

Built from parts because no processor files can be downloaded; saved next to the weights so
that ``AutoProcessor.from_pretrained(checkpoint)`` works for transformers and for vLLM, exactly
as it would for a real checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path


def save_processor(directory: Path, vision_patch_size: int = 16) -> None:
    from omni_serve.compat import torchvision as tv_compat

    tv_compat.install()  # the video processor imports torchvision
    import transformers
    from transformers import Qwen3OmniMoeProcessor, WhisperFeatureExtractor

    from omni_serve.models.common.qwen_tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    vision = {"patch_size": vision_patch_size, "merge_size": 2, "temporal_patch_size": 2}
    processor = Qwen3OmniMoeProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**vision),
        video_processor=transformers.Qwen2VLVideoProcessor(**vision),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(directory)
