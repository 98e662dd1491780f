"""Workarounds for transformers quirks, one function per symptom.

Upstream: transformers 5.19.0.
"""

from __future__ import annotations

from typing import Any


def qwen3_omni_talker_audio_config(talker: Any, thinker_config: Any) -> None:
    """Give the Qwen3-Omni talker's config the thinker's ``audio_config``.

    Symptom (5.19.0): ``Qwen3OmniMoeForConditionalGeneration.generate`` with audio input and
    audio output fails in the talker's ``get_rope_index`` with ``AttributeError:
    'Qwen3OmniMoeTalkerConfig' object has no attribute 'audio_config'``: the talker reuses the
    thinker's M-RoPE index code, which reads ``config.audio_config.n_window``.
    """
    if not hasattr(talker.config, "audio_config"):
        talker.config.audio_config = thinker_config.audio_config
