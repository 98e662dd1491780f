"""Qwen2.5-Omni's stages with real vLLM give transformers' ``generate``: the vLLM Thinker's
text and last-layer rows, then the shared spoken-reply session on the torch Talker (its codes)
and Token2Wav (the waveform), for text, audio, image and video prompts, heard
or only seen (a video's grid as the ingress computes it)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.engines.ar.vllm_engine import VLLMEngine
from omni_serve.models.qwen2_5_omni.family import FAMILY
from omni_serve.models.qwen2_5_omni.token2wav import Token2WavDecoder, Token2WavSettings
from omni_serve.models.thinker_talker.messages import (
    CodecFrame,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
    reply_rows,
)
from omni_serve.models.thinker_talker.speech_session import speak
from omni_serve.models.thinker_talker.thinker_inputs import thinker_prompt, video_grids
from tests.reference import (
    VIDEO_FPS,
    prompt_messages,
    sample_audio,
    sample_image,
    sample_track,
    sample_video,
)
from tests.reference_qwen2_5_omni import (
    NOISE_SEED,
    SPEAKER,
    TALKER_MAX_TOKENS,
    THINKER_MAX_TOKENS,
    reference_run,
)

pytestmark = pytest.mark.integration
# video_audio: a video heard with its audio track (our vLLM plugin places its positions).
KINDS = ("text", "audio", "image", "video", "video_audio")


@pytest.fixture(scope="module")
async def thinker(tiny_qwen2_5_omni_path):
    engine = VLLMEngine(str(tiny_qwen2_5_omni_path), capture_hidden=True)
    await engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf(tiny_qwen2_5_omni_path):
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path)
    processor = AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)
    return model.eval(), processor, {k: reference_run(model.eval(), processor, k) for k in KINDS}


async def thinker_chunks(engine: VLLMEngine, processor, kind: str, layer: int):
    """The vLLM Thinker's stream as the Thinker stage sends it (reply rows by position)."""
    media = {"audios": [sample_audio()]} if kind == "audio" else {}
    if kind == "image":
        media = {"images": [sample_image()]}
    mm_kwargs = {"fps": VIDEO_FPS} if kind.startswith("video") else None
    if kind == "video":
        media = {"videos": [sample_video()]}
    if kind == "video_audio":  # the video heard too: its track interleaved with its frames
        media = {"videos": [sample_video()], "audios": [sample_track()]}
        mm_kwargs = {"fps": VIDEO_FPS, "use_audio_in_video": True}
    ids, mm = thinker_prompt(processor, prompt_messages(kind), **media)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    request = ARRequest(
        f"golden-{kind}",
        prompt_token_ids=ids,
        multi_modal_data=mm or None,
        mm_processor_kwargs=mm_kwargs,
        sampling=SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[eos]),
        capture_layers=(layer,),
    )
    prompt_ids, prompt_rows, seen = None, [], 0
    async for chunk in engine.generate(request):
        prompt_ids = prompt_ids or chunk.prompt_token_ids
        new = chunk.hidden[layer]
        if prompt_rows is not None:
            prompt_rows.append(new[: max(len(prompt_ids) - seen, 0)])
        out = ThinkerChunk(
            chunk.token_ids,
            chunk.text,
            chunk.finished,
            chunk.finish_reason,
            prompt_token_ids=prompt_ids if seen == 0 else None,
            reply_rows=reply_rows(new, seen, len(prompt_ids)),
        )
        seen += new.shape[0]
        if seen >= len(prompt_ids) and prompt_rows is not None:
            out.prompt_rows = {layer: torch.cat(prompt_rows)}
            prompt_rows = None
        yield out


@pytest.mark.parametrize("kind", KINDS)
async def test_stages_give_transformers_generate(thinker, hf, tiny_qwen2_5_omni_path, kind):
    model, processor, runs = hf
    run = runs[kind]
    last = FAMILY.thinker_model(tiny_qwen2_5_omni_path).reply_layer
    parts = FAMILY.load_talker(
        tiny_qwen2_5_omni_path,
        torch.float32,
        "cpu",
        engine=_engine_settings(),
        max_len=1024,
    )
    engine = TorchAREngine(parts.runner, stop_token_ids=parts.stop_token_ids)
    await engine.start()
    mask = run.inputs.get("feature_attention_mask")
    grid = run.inputs.get("image_grid_thw")
    # The ingress's own grid (not the processor's output): vLLM placed the video by its own.
    video = kind.startswith("video")
    video_grid = video_grids(processor, [sample_video()]).tolist() if video else None
    hears = {"use_audio_in_video": True} if kind == "video_audio" else None
    request = SpeakRequest(
        f"speak-{kind}",
        ThinkerRequest(
            f"speak-{kind}",
            run.prompt_ids,
            SamplingConfig(),
            capture=True,
            mm_processor_kwargs=hears,
        ),
        run.prompt_ids,
        SPEAKER,
        {},
        image_grid_thw=None if grid is None else grid.tolist(),
        video_grid_thw=video_grid,
        video_second_per_grid=[processor.video_processor.temporal_patch_size / VIDEO_FPS]
        if video
        else None,
        audio_seqlens=None if mask is None else mask.sum(-1).tolist(),
    )

    async def resolve(rows):
        return rows

    def greedy(_prompt_len: int) -> SamplingConfig:
        return SamplingConfig(max_tokens=TALKER_MAX_TOKENS, repetition_penalty=1.05)

    chunks = thinker_chunks(thinker, processor, kind, last)
    events = [
        e async for e in speak(chunks, engine, parts.feed, request, greedy, resolve, lambda _: None)
    ]
    await engine.shutdown()
    text = [t for e in events if isinstance(e, ThinkerChunk) for t in e.token_ids]
    assert text == run.generated
    codes = torch.tensor([e.codes[0] for e in events if isinstance(e, CodecFrame)])
    assert torch.equal(codes, run.codes)
    dense = Token2WavSettings(noise_seed=NOISE_SEED, block_local_attention=False)
    decoder = Token2WavDecoder(model.token2wav, model.speaker_map, dense)
    assert torch.equal(decoder.decode(codes[None], SPEAKER), run.waveform)
    assert await thinker.pending_captures() == 0


def _engine_settings():
    from omni_serve.config import EngineSettings

    return EngineSettings(kind="torch", max_batch_size=2)


@pytest.mark.parametrize("kind", ["audio", "image", "video"])
async def test_the_encoder_stages_rows_give_transformers_thinker(
    thinker, hf, tiny_qwen2_5_omni_path, kind
):
    """The encoder stage's rows (a clip's spliced into an embeddings prompt, an image's or a
    video's as vLLM's ``*_embeds`` with their grids, on the prompt vLLM expands): the vLLM
    Thinker's text and last-layer rows are transformers'."""
    from omni_serve.models.qwen2_5_omni.encoders import Qwen25OmniEncoders
    from omni_serve.models.thinker_talker.thinker_inputs import (
        splice_rows,
        video_embeds_input,
    )

    model, processor, runs = hf
    run, model_info = runs[kind], FAMILY.thinker_model(tiny_qwen2_5_omni_path)
    encoders = Qwen25OmniEncoders(tiny_qwen2_5_omni_path)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    media_kind = {"image": "images", "video": "videos"}.get(kind)
    if media_kind:
        sample = sample_image() if kind == "image" else sample_video()
        ids, _ = thinker_prompt(processor, prompt_messages(kind), **{media_kind: [sample]})
        prompt: dict = {"prompt_token_ids": ids}
    with torch.no_grad():
        if kind == "audio":
            rows = encoders.encode_clips([sample_audio()]).embeds
            audio_pad = model_info.placeholders["audio"]
            embeds, _ = splice_rows(model_info.embed_tokens, run.prompt_ids, rows, audio_pad)
            prompt, media = {"prompt_embeds": embeds}, None
        elif kind == "image":
            out = encoders.encode_images([sample_image()])
            media = {"image": {"image_embeds": out.embeds, "image_grid_thw": out.meta["grid_thw"]}}
        else:
            out = encoders.encode_videos([sample_video()])
            second = processor.video_processor.temporal_patch_size / VIDEO_FPS
            media = {"video": video_embeds_input(out.embeds, out.meta["grid_thw"], [second])}
    request = ARRequest(
        f"encoded-{kind}",
        **prompt,
        multi_modal_data=media,
        sampling=SamplingConfig(max_tokens=THINKER_MAX_TOKENS, stop_token_ids=[eos]),
        capture_layers=(model_info.reply_layer,),
    )
    tokens, rows = [], []
    async for chunk in thinker.generate(request):
        tokens += chunk.token_ids
        rows.append(chunk.hidden[model_info.reply_layer])
    assert tokens == run.generated
    torch.testing.assert_close(torch.cat(rows), run.last_hidden, atol=1e-4, rtol=0)
