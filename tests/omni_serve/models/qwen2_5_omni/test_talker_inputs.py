"""The Talker's prompt places a video's rows as transformers' generate has the Talker place
them: with the video's audio track interleaved when the Thinker heard it."""

from __future__ import annotations

import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.qwen2_5_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.thinker_talker.messages import SpeakRequest, ThinkerRequest
from tests.reference_qwen2_5_omni import SPEAKER


def test_a_heard_video_is_placed_with_its_audio_interleaved(tiny_model, reference_runs):
    run = reference_runs["video_audio"]
    embed = tiny_model.thinker.get_input_embeddings().weight.detach()
    speakers = tiny_model.speaker_map
    builder = TalkerInputBuilder(tiny_model.talker, tiny_model.config, embed, speakers)
    n, inputs = len(run.prompt_ids), run.inputs
    hears = {"use_audio_in_video": True}
    request = SpeakRequest(
        "v",
        ThinkerRequest("v", run.prompt_ids, SamplingConfig(), mm_processor_kwargs=hears),
        run.prompt_ids,
        SPEAKER.lower(),
        {},
        video_grid_thw=inputs["video_grid_thw"].tolist(),
        video_second_per_grid=inputs["video_second_per_grid"].tolist(),
        audio_seqlens=inputs["feature_attention_mask"].sum(-1).tolist(),
    )
    rows = {1: run.last_hidden[:n]}
    _, extra = builder.prompt(request, run.prompt_ids, rows, run.generated[0], run.last_hidden[n])

    bos = tiny_model.speaker_map[SPEAKER]["bos_token"]
    ids = torch.tensor([run.prompt_ids + [bos, run.generated[0]]])
    expected, delta = tiny_model.talker.get_rope_index(
        ids,
        None,
        inputs["video_grid_thw"],
        torch.ones_like(ids),
        True,
        inputs["feature_attention_mask"].sum(-1),
        inputs["video_second_per_grid"],
    )
    assert torch.equal(extra["position_ids"], expected[:, 0])
    assert extra["rope_delta"] == int(delta) != 0  # not the sequential placement
