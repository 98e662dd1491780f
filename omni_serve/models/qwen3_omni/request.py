"""OpenAI chat messages → the Thinker's prompt, media and the Talker's M-RoPE metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_serve.api.media import load_audio, load_image
from omni_serve.api.protocol import AudioPart, ChatMessage, ImagePart, TextPart, VideoPart
from omni_serve.api.video import load_video
from omni_serve.config import ApiSettings
from omni_serve.models.qwen3_omni.thinker_inputs import (
    thinker_prompt,
    video_frame_size,
    video_grids,
)


@dataclass
class PreparedPrompt:
    prompt_ids: list[int]
    multi_modal_data: dict[str, Any]
    # For the Talker's 3-D positions on multimodal prompts.
    image_grid_thw: torch.Tensor | None = None
    audio_seqlens: torch.Tensor | None = None
    counts: dict[str, int] = field(default_factory=dict)
    # Audio-only prompts go through the encoder stage: the mel features of each clip
    # ([128, frames], unpadded) and the prompt with audio placeholders already expanded.
    audio_features: list[torch.Tensor] = field(default_factory=list)
    expanded_ids: list[int] | None = None
    # Images go through the encoder stage as patches ([P, C*T*p*p], all images) + grids.
    image_pixels: torch.Tensor | None = None
    # Videos go to the Thinker as frames (vLLM encodes them); the Talker's positions need
    # their grids and the seconds each temporal patch spans, and vLLM the frame rate.
    video_grid_thw: torch.Tensor | None = None
    video_second_per_grid: list[float] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None


def _frames(processor, part: VideoPart, api: ApiSettings, param: str) -> np.ndarray:
    return load_video(
        part.video_url.url, api.allow_remote_urls, param,
        max_bytes=api.max_video_bytes, max_seconds=api.max_video_seconds, fps=api.video_fps,
        max_pixels=video_frame_size(processor)["longest_edge"],
    )  # fmt: skip


def has_video_parts(messages: list[ChatMessage]) -> bool:
    return any(
        isinstance(part, VideoPart)
        for message in messages
        if not isinstance(message.content, str)
        for part in message.content
    )


def decode_videos(
    processor, messages: list[ChatMessage], api: ApiSettings
) -> dict[str, np.ndarray]:
    """Each video part's frames, by the part's path (``messages[i].content[j]``). Decoding is
    the slow step of a request with video (up to seconds of CPU), so the ingress runs this off
    its event loop and hands the frames to ``prepare_prompt``."""
    found = {}
    for m, message in enumerate(messages):
        for p, part in enumerate([] if isinstance(message.content, str) else message.content):
            if isinstance(part, VideoPart):
                param = f"messages[{m}].content[{p}]"
                found[param] = _frames(processor, part, api, param)
    return found


def prepare_prompt(
    processor,
    messages: list[ChatMessage],
    api: ApiSettings,
    videos_by_part: dict[str, np.ndarray] | None = None,
) -> PreparedPrompt:
    """``videos_by_part``: frames ``decode_videos`` made (else video parts are decoded here)."""
    rate = processor.feature_extractor.sampling_rate
    audios, images, videos, template_messages = [], [], [], []
    for m_idx, message in enumerate(messages):
        if isinstance(message.content, str):
            template_messages.append({"role": message.role, "content": message.content})
            continue
        parts = []
        for p_idx, part in enumerate(message.content):
            param = f"messages[{m_idx}].content[{p_idx}]"
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": part.text})
            elif isinstance(part, AudioPart):
                audios.append(
                    load_audio(
                        part.input_audio.data,
                        rate,
                        api.max_audio_bytes,
                        api.max_audio_seconds,
                        param,
                    )  # fmt: skip
                )
                parts.append({"type": "audio"})
            elif isinstance(part, ImagePart):
                images.append(load_image(part.image_url.url, api.allow_remote_urls, param))
                parts.append({"type": "image"})
            elif isinstance(part, VideoPart):
                decoded = (videos_by_part or {}).get(param)
                videos.append(
                    decoded if decoded is not None else _frames(processor, part, api, param)
                )
                parts.append({"type": "video"})
        template_messages.append({"role": message.role, "content": parts})
    ids, mm = thinker_prompt(
        processor, template_messages, audios=audios, images=images, videos=videos
    )
    counts = {"audio": len(audios), "image": len(images), "video": len(videos)}
    prepared = PreparedPrompt(ids, mm, counts=counts)
    if videos:
        prepared.video_grid_thw = video_grids(processor, videos)
        step = processor.video_processor.temporal_patch_size / api.video_fps
        prepared.video_second_per_grid = [step] * len(videos)
        prepared.mm_processor_kwargs = {"fps": api.video_fps}
    if images:
        patches = processor.image_processor(images=images, return_tensors="pt")
        prepared.image_grid_thw = patches["image_grid_thw"]
        prepared.image_pixels = patches["pixel_values"]
    if audios:
        features = processor.feature_extractor(
            audios, sampling_rate=rate, return_attention_mask=True, padding=True,
            truncation=False, return_tensors="pt",
        )  # fmt: skip
        prepared.audio_seqlens = features["attention_mask"].sum(-1)
        if not images and not videos:  # audio alone: through the encoder stage
            text = processor.tokenizer.decode(ids)
            expanded = processor(text=text, audio=audios, return_tensors="pt")
            prepared.expanded_ids = expanded["input_ids"][0].tolist()
            mask = expanded["feature_attention_mask"].bool()
            prepared.audio_features = [
                feats[:, valid]
                for feats, valid in zip(expanded["input_features"], mask, strict=True)
            ]
    return prepared
