"""The tiny Qwen2.5-Omni model, its reference runs and Talker requests built from them, shared
by this family's tests."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor, Qwen2_5OmniForConditionalGeneration

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY, TorchAREngine
from omni_serve.models.qwen2_5_omni.talker_inputs import TalkerInputBuilder
from tests.reference import media_layout
from tests.reference_qwen2_5_omni import SPEAKER, TALKER_MAX_TOKENS, reference_run

KINDS = ("text", "audio", "image", "video", "video_audio")


@pytest.fixture(scope="session")
def tiny_model(tiny_qwen2_5_omni_path):
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).eval()


@pytest.fixture(scope="session")
def reference_runs(tiny_model, tiny_qwen2_5_omni_path):
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    return {kind: reference_run(tiny_model, processor, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def builder(tiny_model):
    embed = tiny_model.thinker.get_input_embeddings().weight.detach()
    return TalkerInputBuilder(tiny_model.talker, tiny_model.config, embed)


def talker_request(model, builder, run, request_id: str, stream: bool = False):
    n, generated = len(run.prompt_ids), run.generated
    prompt = builder.build_prompt(
        run.prompt_ids,
        run.last_hidden[:n],
        generated[0],
        run.last_hidden[n],
        model.speaker_map[SPEAKER]["bos_token"],
        use_audio_in_video=run.kind == "video_audio",
        **media_layout(run.inputs),
    )
    last = len(generated) - 1
    trailing = [
        builder.trailing_row(t, None if k == last else run.last_hidden[n + k], k == last)
        for k, t in enumerate(generated)
        if k > 0
    ]
    extra = {
        "position_ids": prompt.position_ids,
        "rope_delta": prompt.rope_delta,
        PENALTY_HISTORY: prompt.codec_history,
    }
    if not stream:
        extra.update(trailing=trailing, text_done=True)
    sampling = SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05)
    request = ARRequest(request_id, prompt_embeds=prompt.embeds, sampling=sampling, extra=extra)
    return request, trailing


async def collect_codes(engine: TorchAREngine, request: ARRequest) -> torch.Tensor:
    tokens = [t async for chunk in engine.generate(request) for t in chunk.token_ids]
    stops = engine.runner.stop_token_ids
    return torch.tensor([t for t in tokens if t not in stops])
