"""Chat messages → what the Thinker engine takes (token ids with placeholders + media)."""

from __future__ import annotations

from typing import Any


def thinker_prompt(processor, messages: list[dict], audios=(), images=()) -> tuple[list[int], dict]:
    """Token ids of the chat template (one placeholder per media item; vLLM expands them) and
    vLLM's ``multi_modal_data``. Audio is 16 kHz float32 mono; images are PIL images."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = processor.tokenizer(text)["input_ids"]
    mm: dict[str, Any] = {}
    if audios:
        rate = processor.feature_extractor.sampling_rate
        mm["audio"] = [(a, rate) for a in audios] if len(audios) > 1 else (audios[0], rate)
    if images:
        mm["image"] = list(images) if len(images) > 1 else images[0]
    return ids, mm
