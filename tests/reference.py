"""Reference runs of transformers' Qwen3-Omni used by golden tests (unit and integration)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

THINKER_MAX_TOKENS = 16
VIDEO_FPS = 2.0  # not the processor's default (1.0): a path that drops the rate shows
TALKER_MAX_TOKENS = 40
SPEAKER = "ethan"


def prompt_messages(kind: str) -> list[dict]:
    if kind == "text":
        content = [{"type": "text", "text": "Say hello to the world."}]
    elif kind == "audio":
        content = [{"type": "audio"}, {"type": "text", "text": "What is this?"}]
    elif kind == "image":
        content = [{"type": "image"}, {"type": "text", "text": "Describe it."}]
    elif kind in ("video", "video_audio"):  # video_audio: the video's audio track heard too
        content = [{"type": "video"}, {"type": "text", "text": "What happens?"}]
    elif kind == "mixed":
        content = [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Both?"}]
    else:
        raise ValueError(kind)
    return [{"role": "user", "content": content}]


def sample_audio() -> np.ndarray:
    t = np.arange(int(16000 * 1.5)) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def sample_track() -> np.ndarray:
    """The sample video's audio track: ``sample_audio`` on 16-bit steps (a PCM track decodes
    to exactly these samples)."""
    return (np.round(sample_audio() * 32768) / 32768).astype(np.float32)


def sample_image() -> Image.Image:
    pixels = (np.random.RandomState(0).rand(64, 96, 3) * 255).astype(np.uint8)
    return Image.fromarray(pixels)


def sample_video() -> np.ndarray:
    """Five frames (an odd count: the processor repeats the last to fill a temporal patch)."""
    return (np.random.RandomState(1).rand(5, 64, 96, 3) * 255).astype(np.uint8)


def processor_inputs(processor, kind: str, track: np.ndarray | None = None) -> dict:
    """``track``: a video's audio track other than ``sample_track`` (``video_audio``)."""
    text = processor.apply_chat_template(
        prompt_messages(kind), add_generation_prompt=True, tokenize=False
    )
    kwargs = {}
    if kind in ("audio", "mixed"):
        kwargs["audio"] = [sample_audio()]
    if kind in ("image", "mixed"):
        kwargs["images"] = [sample_image()]
    if kind == "video":
        kwargs.update(videos=[sample_video()], fps=VIDEO_FPS)
    if kind == "video_audio":
        kwargs.update(
            videos=[sample_video()],
            audio=[sample_track() if track is None else track],
            fps=VIDEO_FPS,
            use_audio_in_video=True,
        )
    return dict(processor(text=text, return_tensors="pt", **kwargs))


def media_layout(inputs: dict) -> dict:
    """The processor's media shapes a Talker prompt builder takes, from ``processor_inputs``."""
    mask = inputs.get("feature_attention_mask")
    return {
        "image_grid_thw": inputs.get("image_grid_thw"),
        "video_grid_thw": inputs.get("video_grid_thw"),
        "audio_seqlens": mask.sum(-1) if mask is not None else None,
        "video_second_per_grid": inputs.get("video_second_per_grid"),
    }


@dataclass
class ReferenceRun:
    inputs: dict
    prompt_ids: list[int]
    generated: list[int]  # thinker tokens
    hidden: dict[int, torch.Tensor]  # layer -> [prompt + generated - 1, H]
    codes: torch.Tensor  # [16, T]
    waveform: torch.Tensor  # [samples]


@torch.no_grad()
def reference_run(model, processor, kind: str) -> ReferenceRun:
    inputs = processor_inputs(processor, kind)
    use_audio_in_video = {"use_audio_in_video": True} if kind == "video_audio" else {}
    seen: list[torch.Tensor] = []
    decode = model.code2wav.chunked_decode

    def spy(codes, **kwargs):
        seen.append(codes.clone())
        return decode(codes, **kwargs)

    model.code2wav.chunked_decode = spy
    try:
        _, wav = model.generate(
            **inputs,
            thinker_max_new_tokens=THINKER_MAX_TOKENS,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=TALKER_MAX_TOKENS,
            speaker=SPEAKER,
            thinker_eos_token_id=model.config.im_end_token_id,
            **use_audio_in_video,
        )
    finally:
        model.code2wav.chunked_decode = decode
    out = model.thinker.generate(
        **inputs,
        max_new_tokens=THINKER_MAX_TOKENS,
        do_sample=False,
        output_hidden_states=True,
        return_dict_in_generate=True,
        eos_token_id=model.config.im_end_token_id,
        **use_audio_in_video,
    )
    n = inputs["input_ids"].shape[1]
    accept = model.config.talker_config.accept_hidden_layer
    hidden = {k: torch.cat([step[k] for step in out.hidden_states], dim=1)[0] for k in (0, accept)}
    return ReferenceRun(
        inputs=inputs,
        prompt_ids=inputs["input_ids"][0].tolist(),
        generated=out.sequences[0, n:].tolist(),
        hidden=hidden,
        codes=seen[0][0],
        waveform=wav[0, 0],
    )


def request_parts(kind: str) -> list[dict]:
    """Chat content parts of a reference prompt, as a client sends them, media encoded
    losslessly (the served graph then sees what the reference run saw)."""
    from omni_serve.testing.media import png_data_url, video_data_url, wav_b64

    parts = []
    for part in prompt_messages(kind)[0]["content"]:
        if part["type"] == "audio":
            data = wav_b64(sample_audio(), 16000, subtype="FLOAT")
            parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
        elif part["type"] == "image":
            url = png_data_url(sample_image())
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif part["type"] == "video":  # at the API's rate (2 fps): every frame is taken
            track = sample_audio() if kind == "video_audio" else None  # 16-bit PCM in the file
            url = video_data_url(sample_video(), rate=int(VIDEO_FPS), lossless=True, audio=track)
            parts.append({"type": "video_url", "video_url": {"url": url}})
        else:
            parts.append(part)
    return parts
