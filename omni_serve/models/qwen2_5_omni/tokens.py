"""Qwen2.5-Omni's special tokens in the tiny tokenizer's layout (``models/common/qwen_tokenizer``).

Its real tokenizer names its media tokens differently from Qwen3's (``<|AUDIO|>``,
``<|audio_bos|>``, ``<|vision_bos|>``, ``<|IMAGE|>``, ``<|VIDEO|>``), in this order from
151643. The Talker's text tokens (``tts_text_*``) and each voice's first text token sit far
above them in the real vocabulary (151859 on); here they follow the list, since a tiny
vocabulary cannot reach that far, and the preset's config names their ids.
"""

from __future__ import annotations

from omni_serve.models.common.qwen_tokenizer import SPECIAL_BASE

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    # Not at their real ids (see above).
    "<|tts_pad|>",
    "<|tts_text_bos|>",
    "<|tts_text_eod|>",
    "<|tts_bos_chelsie|>",
    "<|tts_bos_ethan|>",
]

NAMED_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def token_id(token: str) -> int:
    return SPECIAL_BASE + SPECIAL_TOKENS.index(token)
