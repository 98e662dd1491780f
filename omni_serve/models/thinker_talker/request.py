"""OpenAI chat messages → the Thinker's prompt, media and the Talker's M-RoPE metadata."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni_serve.config import ApiSettings
from omni_serve.kv_store.content_key import PromptContent, media_digest
from omni_serve.media.chat_parts import (
    AudioPart,
    AudioUrlPart,
    ChatMessage,
    ImagePart,
    TextPart,
    VideoPart,
)
from omni_serve.media.decode import (
    MediaError,
    check_container,
    input_audio_bytes,
    load_audio,
    load_image,
    url_bytes,
)
from omni_serve.media.fetch import RemoteMedia
from omni_serve.media.video import load_video, load_video_audio
from omni_serve.models.thinker_talker.family import ThinkerTalkerFamily
from omni_serve.models.thinker_talker.thinker_inputs import (
    audio_frames,
    expand_audio_placeholders,
    image_grids,
    min_audio_samples,
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
    # Audio-only prompts go through the encoder stage: each clip's samples (16 kHz float32;
    # the encoder makes their mel features) and the prompt with audio placeholders expanded.
    audio_clips: list[np.ndarray] = field(default_factory=list)
    expanded_ids: list[int] | None = None
    # Videos stay frames (in ``multi_modal_data``), for the encoder stage or the Thinker's
    # vLLM; the Talker's positions need their grids and the seconds each temporal patch
    # spans, and vLLM, when it encodes them, the frame rate.
    video_grid_thw: torch.Tensor | None = None
    video_second_per_grid: list[float] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    # What the app's KV store finds this prompt's kept prefixes by (ids and media digests).
    content: PromptContent | None = None


def prompt_content(processor: Any, ids: list[int], items: dict[str, list[Any]]) -> PromptContent:
    """The prompt's content key: its ids, and each media item's digest where its placeholder
    starts (the k-th run of a modality's placeholder is its k-th item). An audio track
    interleaved with its video has no placeholder of its own: the video's digest covers the
    frames, and the video placeholder's run is where the two start."""
    media = []
    for modality in ("audio", "image", "video"):
        token = getattr(processor, f"{modality}_token", None)
        if token is None or not items.get(modality):
            continue
        pad = processor.tokenizer.convert_tokens_to_ids(token)
        starts = [i for i, t in enumerate(ids) if t == pad and (i == 0 or ids[i - 1] != pad)]
        media += [(s, media_digest(item)) for s, item in zip(starts, items[modality], strict=False)]
    return PromptContent(list(ids), sorted(media))


UrlPart = AudioUrlPart | ImagePart | VideoPart
MediaPart = AudioPart | UrlPart
_KINDS = {AudioPart: "audio", AudioUrlPart: "audio", ImagePart: "image", VideoPart: "video"}


def _media_parts(messages: list[ChatMessage]) -> list[tuple[str, MediaPart]]:
    """Each audio, image and video part with its path (``messages[i].content[j]``), the name
    a 400 about it gives."""
    return [
        (f"messages[{m}].content[{p}]", part)
        for m, message in enumerate(messages)
        if not isinstance(message.content, str)
        for p, part in enumerate(message.content)
        if isinstance(part, MediaPart)
    ]


def _url(part: UrlPart) -> str:
    if isinstance(part, AudioUrlPart):
        return part.audio_url.url
    return part.image_url.url if isinstance(part, ImagePart) else part.video_url.url


def _max_bytes(kind: str, api: ApiSettings) -> int:
    return {
        "audio": api.max_audio_bytes,
        "image": api.max_image_bytes,
        "video": api.max_video_bytes,
    }[kind]


def _decode(
    processor: Any,
    part: MediaPart,
    api: ApiSettings,
    param: str,
    fetched: Mapping[str, bytes],
    hear_video: bool,
) -> Any:
    """A part's samples (audio), image or frames (video; with ``hear_video``, frames and
    audio track). Reads the processor's settings and never encodes with it, so it may run on
    any thread."""
    kind = _KINDS[type(part)]
    if isinstance(part, AudioPart):
        raw = input_audio_bytes(part.input_audio.data, api.max_audio_bytes, param)
        check_container(raw, part.input_audio.format, f"{param}.input_audio")
    else:
        raw = url_bytes(_url(part), fetched, kind, _max_bytes(kind, api), param)
    if kind == "audio":
        rate = processor.feature_extractor.sampling_rate
        return load_audio(raw, rate, api.max_audio_seconds, param, min_audio_samples(processor))
    if isinstance(part, ImagePart):
        return load_image(raw, api.max_input_image_pixels, param)
    frames = load_video(
        raw,
        param,
        max_seconds=api.max_video_seconds,
        fps=api.video_fps,
        max_pixels=video_frame_size(processor)["longest_edge"],
    )
    if not hear_video:
        return frames
    rate = processor.feature_extractor.sampling_rate
    track = load_video_audio(
        raw,
        rate,
        param,
        max_seconds=api.max_video_seconds,
        min_samples=min_audio_samples(processor),
    )
    return frames, track


def remote_media(messages: list[ChatMessage], api: ApiSettings) -> list[RemoteMedia]:
    """The URL parts whose URL is not a data: URL, for ``media_fetch``."""
    remote = []
    for param, part in _media_parts(messages):
        if isinstance(part, UrlPart) and not _url(part).startswith("data:"):
            kind = _KINDS[type(part)]
            remote.append(RemoteMedia(_url(part), kind, _max_bytes(kind, api), param))
    return remote


def has_media_parts(messages: list[ChatMessage]) -> bool:
    return bool(_media_parts(messages))


def over_media_limits(
    messages: list[ChatMessage], limits: dict[str, Any], use_audio_in_video: bool = False
) -> str | None:
    """Why the messages carry more items of a kind than the Thinker's vLLM takes in one prompt
    (its ``limit_mm_per_prompt``: a count, or ``{"count": n, ...}``), or audio besides the
    videos' own where the videos are heard, else None. Checked before anything decodes: vLLM
    would refuse the prompt only after the media were decoded, sent and encoded."""
    counts: dict[str, int] = {}
    for _, part in _media_parts(messages):
        counts[_KINDS[type(part)]] = counts.get(_KINDS[type(part)], 0) + 1
    if use_audio_in_video and counts.get("video"):
        if counts.get("audio"):  # vLLM pairs the audio items with the videos, one to one
            return (
                "with use_audio_in_video the audio comes from the videos: send no "
                "input_audio parts with it"
            )
        counts["audio"] = counts["video"]  # each video's track is an audio item
    for kind, count in counts.items():
        limit = media_limit(limits, kind)
        if limit is not None and count > limit:
            return f"at most {limit} {kind} item(s) per request; this one has {count}"
    return None


def media_limit(limits: dict[str, Any], kind: str) -> int | None:
    """How many ``kind`` items one prompt takes (vLLM's ``limit_mm_per_prompt`` entry: a
    count, or ``{"count": n, ...}``); None: no limit."""
    limit = limits.get(kind)
    limit = limit.get("count") if isinstance(limit, dict) else limit
    return None if limit is None else int(limit)


def decode_media(
    processor: Any,
    messages: list[ChatMessage],
    api: ApiSettings,
    fetched: Mapping[str, bytes] | None = None,
    use_audio_in_video: bool = False,
) -> dict[str, Any]:
    """Each media part decoded, by its path. Decoding is most of a media request's CPU (a
    1080p PNG ~50 ms, a video seconds), so the ingress runs this off its event loop, several
    requests at once, and hands the result to ``prepare_prompt``."""
    fetched = fetched or {}
    return {
        param: _decode(processor, part, api, param, fetched, use_audio_in_video)
        for param, part in _media_parts(messages)
    }


def prepare_prompt(
    processor: Any,
    messages: list[ChatMessage],
    api: ApiSettings,
    decoded: dict[str, Any] | None = None,
    use_audio_in_video: bool = False,
    *,
    family: ThinkerTalkerFamily,
) -> PreparedPrompt:
    """``decoded``: what ``decode_media`` made (parts missing from it are decoded here).
    ``family``: the model's family, whose rules the prompt follows (audio clips' lengths).
    ``use_audio_in_video``: each video's audio track is an audio item of the prompt (with no
    placeholder of its own: the processors interleave its tokens with the video's)."""
    decoded = decoded or {}
    longest = family.longest_clip(processor)
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
                continue
            item = decoded.get(param)
            if item is None:
                item = _decode(processor, part, api, param, {}, use_audio_in_video)
            if isinstance(part, AudioPart | AudioUrlPart):
                _check_clip_length(processor, item, longest, param)
                audios.append(item)
                parts.append({"type": "audio"})
            elif isinstance(part, ImagePart):
                images.append(item)
                parts.append({"type": "image"})
            else:
                if use_audio_in_video:
                    item, track = item
                    _check_clip_length(processor, track, longest, param)
                    audios.append(track)
                videos.append(item)
                parts.append({"type": "video"})
        template_messages.append({"role": message.role, "content": parts})
    ids, mm = thinker_prompt(
        processor, template_messages, audios=audios, images=images, videos=videos
    )
    counts = {"audio": len(audios), "image": len(images), "video": len(videos)}
    prepared = PreparedPrompt(ids, mm, counts=counts)
    placed = {"audio": [] if use_audio_in_video else audios, "image": images, "video": videos}
    prepared.content = prompt_content(processor, ids, placed)
    if videos:
        prepared.video_grid_thw = video_grids(processor, videos)
        step = processor.video_processor.temporal_patch_size / api.video_fps
        prepared.video_second_per_grid = [step] * len(videos)
        prepared.mm_processor_kwargs = {"fps": api.video_fps}
        if use_audio_in_video:  # vLLM pairs the audio items with the videos, interleaved
            prepared.mm_processor_kwargs["use_audio_in_video"] = True
    if images:
        prepared.image_grid_thw = image_grids(processor, images)  # patched by the encoder
    if audios:
        prepared.audio_seqlens = audio_frames(processor, audios)
        if not images and not videos:  # audio alone: through the encoder stage
            rows = family.audio_tokens(processor, prepared.audio_seqlens).tolist()
            prepared.expanded_ids = expand_audio_placeholders(processor, ids, rows)
            prepared.audio_clips = list(audios)  # their features are made by the encoder
    return prepared


def _check_clip_length(processor: Any, clip: np.ndarray, longest: int | None, param: str) -> None:
    if longest is not None and len(clip) > longest:
        rate = processor.feature_extractor.sampling_rate
        message = (
            f"this model hears at most {longest / rate:g} s of audio per clip; this one is "
            f"{len(clip) / rate:.1f} s (split it into several clips)"
        )
        raise MediaError(message, param)
