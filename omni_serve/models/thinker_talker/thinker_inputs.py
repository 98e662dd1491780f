"""Chat messages → what the Thinker engine takes (token ids with placeholders + media)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
    smart_resize as image_smart_resize,
)
from transformers.models.qwen2_vl.video_processing_qwen2_vl import smart_resize

from omni_serve.models.thinker_talker.media_payload import media_from_payload
from omni_serve.models.thinker_talker.messages import ThinkerRequest
from omni_serve.models.thinker_talker.session_rows import digest, media_digests
from omni_serve.transport import take


def thinker_prompt(
    processor: Any,
    messages: list[dict],
    audios: Sequence[Any] = (),
    images: Sequence[Any] = (),
    videos: Sequence[Any] = (),
) -> tuple[list[int], dict]:
    """Token ids of the chat template (one placeholder per media item; vLLM expands them) and
    vLLM's ``multi_modal_data``. Audio is 16 kHz float32 mono; images are PIL images; videos
    are uint8 frames [T, H, W, 3]."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = processor.tokenizer(text)["input_ids"]
    mm: dict[str, Any] = {}
    if audios:
        rate = processor.feature_extractor.sampling_rate
        mm["audio"] = [(a, rate) for a in audios] if len(audios) > 1 else (audios[0], rate)
    if images:
        mm["image"] = list(images) if len(images) > 1 else images[0]
    if len(videos):
        mm["video"] = list(videos) if len(videos) > 1 else videos[0]
    return ids, mm


def video_frame_size(processor: Any) -> dict[str, int]:
    """The pixel bounds (``shortest_edge``, ``longest_edge``) the processor resizes video
    frames to. Its call merges the model's own video defaults over the video processor's
    (Qwen3-Omni: 768 x 32 x 32 pixels at most, not the video processor's 602,112; Qwen2.5-Omni:
    128 to 768 x 28 x 28), so read them as the call merges them, through the processor's own
    kwargs class."""
    merged = processor._merge_kwargs(
        processor.valid_processor_kwargs, tokenizer_init_kwargs=processor.tokenizer.init_kwargs
    )
    return dict(merged["videos_kwargs"]["size"])


def video_grids(processor: Any, videos: Sequence[Any]) -> torch.Tensor:
    """Each video's (t, h, w) patch grid, as the processor makes it (transformers'
    ``smart_resize`` and ``get_num_of_video_patches`` rules), without resizing and
    normalising every frame just to count patches."""
    size, video_processor = video_frame_size(processor), processor.video_processor
    patch, temporal = video_processor.patch_size, video_processor.temporal_patch_size
    grids = []
    for frames in videos:
        n, height, width = frames.shape[:3]
        height, width = smart_resize(
            height,
            width,
            patch * video_processor.merge_size,
            size["shortest_edge"],
            size["longest_edge"],
        )
        grids.append([-(-n // temporal), height // patch, width // patch])
    return torch.tensor(grids)


def image_grids(processor: Any, images: Sequence[Any]) -> torch.Tensor:
    """Each image's (1, h, w) patch grid, as the image processor makes it (its ``smart_resize``
    rule), without resizing and normalising the image: the encoder stage patches images."""
    image_processor = processor.image_processor
    size, patch = image_processor.size, image_processor.patch_size
    grids = []
    for image in images:
        width, height = image.size
        height, width = image_smart_resize(
            height,
            width,
            patch * image_processor.merge_size,
            size["shortest_edge"],
            size["longest_edge"],
        )
        grids.append([1, height // patch, width // patch])
    return torch.tensor(grids)


def audio_frames(processor: Any, clips: Sequence[Any]) -> torch.Tensor:
    """Each clip's mel frame count as the feature extractor makes its features (its centred
    STFT gives ``1 + n // hop`` frames and drops the last), without making them."""
    hop = processor.feature_extractor.hop_length
    return torch.tensor([len(clip) // hop for clip in clips])


def min_audio_samples(processor: Any) -> int:
    """The shortest clip the feature extractor takes: its STFT reflects ``n_fft // 2`` samples
    at each edge, which needs more than that many."""
    return processor.feature_extractor.n_fft // 2 + 1


def clip_features(feature_extractor: Any, clip: Any) -> torch.Tensor:
    """One clip's log-mel features [mel, frames], made as if the clip came alone. Padded to
    the longest clip in a batch (as transformers' processor does), a shorter clip's last frame
    sees the padding in its STFT window instead of the reflected edge: the same clip would get
    other features, and other rows and KV, in a chat's next turn once a longer clip joins it."""
    out = feature_extractor(
        [np.asarray(clip, dtype=np.float32)],
        sampling_rate=feature_extractor.sampling_rate,
        return_attention_mask=True,
        padding=True,
        truncation=False,
        return_tensors="pt",
    )
    return out["input_features"][0][:, out["attention_mask"][0].bool()]


def expand_audio_placeholders(
    processor: Any, ids: list[int], rows_per_clip: list[int]
) -> list[int]:
    """``ids`` with each clip's one audio placeholder repeated once per audio-tower row, as the
    processor expands them (the family's ``audio_tokens`` counts the rows from the clips' mel
    frames: no second mel pass over the clips just to count)."""
    rows = iter(rows_per_clip)
    audio = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    out: list[int] = []
    for token in ids:
        out.extend([token] * next(rows) if token == audio else [token])
    return out


def splice_rows(
    embed_tokens: torch.Tensor, prompt_ids: list[int], rows: torch.Tensor, token_id: int
) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """The prompt as embeddings, ``rows`` (an encoder stage's output) at the positions of
    ``token_id``; and for each run of those positions (one media item) its offset and a digest
    of its rows. The digests stand in for the media's identity where vLLM sees no media (an
    embeddings prompt): KV blocks covering an item load only into a prompt with the same item."""
    ids = torch.tensor(prompt_ids)
    slots = ids == token_id
    if int(slots.sum()) != rows.shape[0]:
        raise ValueError(f"{int(slots.sum())} media positions but {rows.shape[0]} encoder rows")
    embeds = embed_tokens[ids].clone()
    embeds[slots] = rows.to(embeds.dtype)
    items: list[tuple[int, str]] = []
    used, start = 0, None
    for i, slot in enumerate([*slots.tolist(), False]):
        if slot and start is None:
            start = i
        elif not slot and start is not None:
            items.append((start, f"rows:{digest(rows[used : used + i - start])}"))
            used, start = used + i - start, None
    return embeds, items


def video_embeds_input(
    rows: torch.Tensor, grid_thw: torch.Tensor, second_per_grid: Sequence[float]
) -> dict[str, torch.Tensor]:
    """``multi_modal_data["video"]`` for a prompt's videos encoded elsewhere: their rows
    (all videos, deepstack features concatenated on the last dim), grids, and seconds per
    temporal patch."""
    return {
        "video_embeds": rows,
        "video_grid_thw": grid_thw,
        "second_per_grid_ts": torch.as_tensor(second_per_grid, dtype=torch.float32),
        "use_audio_in_video": torch.tensor(False),
    }


@dataclass
class EngineInputs:
    """A ``ThinkerRequest`` as the engine takes it. ``prompt``: ``prompt_token_ids`` or
    ``prompt_embeds`` (encoded audio spliced in); ``raw``: the media the engine encodes
    itself; ``spliced``: the encoded audio items in an embeddings prompt (offset, digest);
    ``encoded``: the encoder stage's image and video rows with their grids."""

    prompt: dict[str, Any]
    multi_modal_data: dict[str, Any]
    raw: dict[str, Any]
    spliced: list[tuple[int, str]] | None
    encoded: dict[str, tuple[torch.Tensor, Any]]

    def media_digests(self, merge_size: int) -> dict[str, list[str]]:
        return media_digests(self.raw, self.spliced, self.encoded, merge_size)


def checked_rows(rows: torch.Tensor, grid_thw: Any, merge_size: int, modality: str) -> torch.Tensor:
    """``rows`` if they are as many as their grids make: vLLM matches encoded rows to items
    only inside its engine core, and a mismatch there kills the core (and every request on
    it), where here it fails this request alone."""
    grids = torch.as_tensor(grid_thw).reshape(-1, 3).tolist()
    expected = sum(int(t * h * w) // merge_size**2 for t, h, w in grids)
    if rows.ndim != 2 or rows.shape[0] != expected:
        raise ValueError(
            f"the encoder stage's {modality} rows have shape {tuple(rows.shape)}, but their "
            f"grids {grids} make {expected} rows"
        )
    return rows


async def engine_inputs(
    request: ThinkerRequest, embed_tokens: torch.Tensor, audio_token_id: int, merge_size: int
) -> EngineInputs:
    """Reads the request's media off the channel (this takes its refs)."""
    prompt: dict[str, Any] = {"prompt_token_ids": request.prompt_ids}
    raw: dict[str, Any] = {}
    if request.media is not None:
        raw = media_from_payload(await take(request.media.ref), request.media.layout)
    media = dict(raw)
    spliced = None
    if request.audio_rows is not None:
        rows = await take(request.audio_rows)
        embeds, spliced = splice_rows(embed_tokens, request.prompt_ids, rows, audio_token_id)
        prompt = {"prompt_embeds": embeds}
    encoded: dict[str, tuple[torch.Tensor, Any]] = {}
    if request.image_rows is not None:
        grid = request.image_grid_thw
        rows = checked_rows(await take(request.image_rows), grid, merge_size, "image")
        encoded["image"] = (rows, grid)
        media["image"] = {
            "image_embeds": encoded["image"][0],
            "image_grid_thw": torch.as_tensor(grid),
        }
    if request.video_rows is not None:
        grid = request.video_grid_thw
        rows = checked_rows(await take(request.video_rows), grid, merge_size, "video")
        encoded["video"] = (rows, grid)
        media["video"] = video_embeds_input(
            encoded["video"][0], torch.as_tensor(grid), request.video_second_per_grid
        )
    return EngineInputs(prompt, media, raw, spliced, encoded)
