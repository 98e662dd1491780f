"""An omni model's processor (its tokenizer, Whisper features, Qwen2-VL image and video
processors), built from parts because no processor files can be downloaded, and saved next to
the weights so that ``AutoProcessor.from_pretrained(checkpoint)`` works for transformers and
for vLLM, exactly as it would for a real checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_omni_processor(
    directory: Path, processor_class: Any, tokenizer: Any, vision_patch_size: int
) -> None:
    """``processor_class``: the family's transformers processor (``Qwen3OmniMoeProcessor``,
    ``Qwen2_5OmniProcessor``); ``tokenizer``: its tiny tokenizer (``qwen_tokenizer``)."""
    from omni_serve.compat import torchvision as tv_compat

    tv_compat.install()  # the video processor imports torchvision
    import transformers
    from transformers import WhisperFeatureExtractor

    vision = {"patch_size": vision_patch_size, "merge_size": 2, "temporal_patch_size": 2}
    processor = processor_class(
        image_processor=transformers.Qwen2VLImageProcessor(**vision),
        video_processor=transformers.Qwen2VLVideoProcessor(**vision),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(directory)
