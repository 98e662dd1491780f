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


def qwen2_5_omni_dit_broadcast_block_mask(dit: Any) -> None:
    """Hand the Qwen2.5-Omni Token2Wav DiT's layers a block-difference table they broadcast.

    Symptom (5.19.0): ``Qwen2_5OmniToken2WavDiTModel._create_block_diff`` expands the [n, n]
    table to [batch, heads, n, n] (batch 2 under guidance), and every ``DiTDecoderLayer``
    compares all of it anew into a boolean mask of that size, in every ODE evaluation: a
    quarter of a 528-frame window's decode on a CPU core (4.5 -> 3.2 s on
    ``small-qwen2-5-omni``, 4 heads). The [1, 1, n, n] table gives SDPA the same mask,
    broadcast, and the mel bit for bit the same (``test_token2wav.py``).
    """

    def block_diff(hidden_states: Any) -> Any:
        import torch

        blocks = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        blocks = blocks // dit.block_size
        return (blocks[None, :] - blocks[:, None])[None, None]

    dit._create_block_diff = block_diff
