"""Golden tests of the engine layer against transformers' own Qwen3-Omni, with real vLLM."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.engines.codec.chunked import ChunkPlanner
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.models.thinker_talker.thinker_inputs import thinker_prompt
from tests.reference import (
    SPEAKER,
    TALKER_MAX_TOKENS,
    THINKER_MAX_TOKENS,
    VIDEO_FPS,
    prompt_messages,
    sample_audio,
    sample_image,
    sample_track,
    sample_video,
)

pytestmark = pytest.mark.integration
KINDS = ("text", "audio", "image", "video", "video_audio")


async def run_thinker(engine, processor, kind: str, layers=(0, 1)):
    media = {"audios": [sample_audio()]} if kind == "audio" else {}
    if kind == "image":
        media = {"images": [sample_image()]}
    if kind == "video":  # at the reference's rate: vLLM's default would place frames elsewhere
        media = {"videos": [sample_video()]}
    mm_kwargs = {"fps": VIDEO_FPS} if kind.startswith("video") else None
    if kind == "video_audio":  # the video heard too: its track interleaved with its frames
        media = {"videos": [sample_video()], "audios": [sample_track()]}
        mm_kwargs = {"fps": VIDEO_FPS, "use_audio_in_video": True}
    ids, mm = thinker_prompt(processor, prompt_messages(kind), **media)
    sampling = SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[302])
    request = ARRequest(
        f"golden-{kind}-{len(layers)}",
        prompt_token_ids=ids,
        multi_modal_data=mm or None,
        sampling=sampling,
        capture_layers=layers,
        mm_processor_kwargs=mm_kwargs,
    )
    tokens, rows = [], {k: [] for k in layers}
    async for chunk in engine.generate(request):
        tokens += chunk.token_ids
        for k, v in chunk.hidden.items():
            rows[k].append(v)
    return ids, tokens, {k: torch.cat(v) for k, v in rows.items() if v}


@pytest.mark.parametrize("kind", KINDS)
async def test_vllm_thinker_matches_transformers(
    vllm_thinker, omni_processor, reference_runs, kind
):
    """vLLM greedy text == transformers greedy text; captured hidden rows within 1e-4."""
    ref = reference_runs[kind]
    _, tokens, hidden = await run_thinker(vllm_thinker, omni_processor, kind)
    assert tokens == ref.generated
    for layer in (0, 1):
        assert hidden[layer].shape == ref.hidden[layer].shape
        torch.testing.assert_close(hidden[layer], ref.hidden[layer], atol=1e-4, rtol=0)
    assert await vllm_thinker.pending_captures() == 0  # rows are released with the request


async def test_requests_without_capture_return_no_rows(vllm_thinker, omni_processor):
    _, tokens, hidden = await run_thinker(vllm_thinker, omni_processor, "text", layers=())
    assert tokens and hidden == {}


async def test_thinker_talker_code2wav_chain_equals_transformers_audio(
    vllm_thinker, omni_processor, reference_runs, tiny_omni_path
):
    """The staged engines (vLLM Thinker -> torch Talker -> Code2wav) give transformers' waveform."""
    ref = reference_runs["text"]
    ids, tokens, hidden = await run_thinker(vllm_thinker, omni_processor, "text")
    talker, config = load_talker(tiny_omni_path)
    builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path))
    n = len(ids)
    prompt = builder.build_prompt(ids, hidden[0][:n], hidden[1][:n], tokens[0], SPEAKER)
    trailing = [
        builder.trailing_row(t, None, i == len(tokens) - 1) for i, t in enumerate(tokens) if i
    ]
    runner = TalkerRunner(talker, builder.tts_pad, max_batch_size=2, max_len=1024)
    engine = TorchAREngine(runner, stop_token_ids=(runner.codec_eos_token_id,))
    await engine.start()
    request = ARRequest(
        "chain",
        prompt_embeds=prompt.embeds,
        sampling=SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05),
        extra={
            "position_ids": prompt.position_ids,
            "rope_delta": prompt.rope_delta,
            "trailing": trailing,
            "text_done": True,
        },
    )
    codec, context = load_code2wav_decoder(tiny_omni_path)
    planner = ChunkPlanner(codec.samples_per_frame, left_context=context)
    audio = []
    async for chunk in engine.generate(request):
        if "codes" in chunk.outputs:
            audio += codec.run(planner.push(chunk.outputs["codes"][:, None]))
    last = planner.finish()
    audio += codec.run([last] if last else [])
    await engine.shutdown()
    waveform = torch.cat(audio)
    assert waveform.shape == ref.waveform.shape
    torch.testing.assert_close(waveform, ref.waveform, atol=1e-4, rtol=0)


async def test_prompt_embeds_input_matches_token_ids(vllm_thinker, omni_processor, hf_omni):
    """The Thinker takes precomputed input embeddings (the path an encoder stage feeds)."""
    ids, tokens, _ = await run_thinker(vllm_thinker, omni_processor, "text", layers=())
    with torch.no_grad():
        embeds = hf_omni.thinker.get_input_embeddings()(torch.tensor(ids))
    request = ARRequest(
        "embeds",
        prompt_embeds=embeds,
        sampling=SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[302]),
    )
    from_embeds = [t async for chunk in vllm_thinker.generate(request) for t in chunk.token_ids]
    assert from_embeds == tokens


async def test_cancelled_request_is_aborted_and_releases_rows(vllm_thinker, omni_processor):
    media = {}
    ids, mm = thinker_prompt(omni_processor, prompt_messages("text"), **media)
    request = ARRequest(
        "cancel-me",
        prompt_token_ids=ids,
        sampling=SamplingConfig(max_tokens=200),
        capture_layers=(0, 1),
    )
    stream = vllm_thinker.generate(request)
    await stream.__anext__()
    await stream.aclose()  # the consumer went away mid-generation
    assert await vllm_thinker.pending_captures() == 0
    # the engine keeps serving
    _, tokens, _ = await run_thinker(vllm_thinker, omni_processor, "text", layers=())
    assert tokens


async def collect(engine, request):
    tokens, rows = [], []
    async for chunk in engine.generate(request):
        tokens += chunk.token_ids
        if 1 in chunk.hidden:
            rows.append(chunk.hidden[1])
    return tokens, torch.cat(rows)


async def test_encoder_stage_outputs_give_the_monolithic_result(
    vllm_thinker, omni_processor, reference_runs, tiny_omni_path
):
    """Image rows (with deepstack) as image_embeds, audio rows spliced into prompt_embeds:
    the Thinker's tokens and hidden rows equal transformers' end-to-end model."""
    from omni_serve.models.qwen3_omni.checkpoint import load_thinker_embeddings
    from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
    from tests.reference import processor_inputs

    encoders = Qwen3OmniEncoders(tiny_omni_path)
    sampling = SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[302])

    inputs = processor_inputs(omni_processor, "image")
    with torch.no_grad():
        image = encoders.encode_image(inputs["pixel_values"], inputs["image_grid_thw"])
    ids, _ = thinker_prompt(omni_processor, prompt_messages("image"), images=[sample_image()])
    media = {
        "image": {
            "image_embeds": torch.cat([image.embeds, *image.deepstack], dim=-1),
            "image_grid_thw": inputs["image_grid_thw"],
        }
    }
    request = ARRequest(
        "enc-image",
        prompt_token_ids=ids,
        multi_modal_data=media,
        sampling=sampling,
        capture_layers=(1,),
    )
    tokens, rows = await collect(vllm_thinker, request)
    assert tokens == reference_runs["image"].generated
    torch.testing.assert_close(rows, reference_runs["image"].hidden[1], atol=1e-4, rtol=0)

    inputs = processor_inputs(omni_processor, "audio")
    valid = inputs["feature_attention_mask"][0].bool()
    with torch.no_grad():
        audio = encoders.encode_audio(inputs["input_features"][0][:, valid], valid.sum()[None])
    ids = inputs["input_ids"][0]
    embeds = load_thinker_embeddings(tiny_omni_path)[ids].clone()
    embeds[ids == 332] = audio.embeds
    request = ARRequest("enc-audio", prompt_embeds=embeds, sampling=sampling, capture_layers=(1,))
    tokens, rows = await collect(vllm_thinker, request)
    assert tokens == reference_runs["audio"].generated
    torch.testing.assert_close(rows, reference_runs["audio"].hidden[1], atol=1e-4, rtol=0)


async def test_encoder_stage_video_rows_give_the_monolithic_result(
    vllm_thinker, omni_processor, reference_runs, tiny_omni_path
):
    """A video's rows from the encoder stage's tower as video_embeds (with its grid and seconds
    per temporal patch): the Thinker's tokens and hidden rows equal transformers'."""
    from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
    from omni_serve.models.thinker_talker.thinker_inputs import video_embeds_input
    from tests.reference import processor_inputs

    inputs = processor_inputs(omni_processor, "video")
    with torch.no_grad():
        video = Qwen3OmniEncoders(tiny_omni_path).encode_image(
            inputs["pixel_values_videos"], inputs["video_grid_thw"]
        )
    rows = torch.cat([video.embeds, *video.deepstack], dim=-1)
    ids, _ = thinker_prompt(omni_processor, prompt_messages("video"), videos=[sample_video()])
    media = {"video": video_embeds_input(rows, inputs["video_grid_thw"], [1.0])}
    sampling = SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[302])
    request = ARRequest(
        "enc-video",
        prompt_token_ids=ids,
        multi_modal_data=media,
        sampling=sampling,
        capture_layers=(1,),
    )
    tokens, rows = await collect(vllm_thinker, request)
    assert inputs["video_second_per_grid"].tolist() == [1.0]
    assert tokens == reference_runs["video"].generated
    torch.testing.assert_close(rows, reference_runs["video"].hidden[1], atol=1e-4, rtol=0)
