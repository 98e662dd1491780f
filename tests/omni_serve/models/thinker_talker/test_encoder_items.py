"""Each media item's rows are the ones the towers give it, whether it is encoded with others,
alone, or found in the cache; and an item a conversation sends again is not encoded again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omni_serve.engines.encoders.item_cache import EncodedItemCache
from omni_serve.models.qwen2_5_omni.encoders import Qwen25OmniEncoders
from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
from omni_serve.models.thinker_talker.encoder_items import CachedEncoders
from tests.reference import sample_audio, sample_image, sample_video


@pytest.fixture(scope="module", params=["qwen3_omni", "qwen2_5_omni"])
def encoders(request):
    if request.param == "qwen3_omni":
        return Qwen3OmniEncoders(request.getfixturevalue("tiny_omni_path"))
    return Qwen25OmniEncoders(request.getfixturevalue("tiny_qwen2_5_omni_path"))


def cached(encoders) -> CachedEncoders:
    return CachedEncoders(encoders, EncodedItemCache(64 << 20))


def clip_features(encoders, clips: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
    """The clips' features side by side, each made alone."""
    feats = [encoders.clip_features(clip) for clip in clips]
    return torch.cat(feats, dim=1), [f.shape[1] for f in feats]


@torch.no_grad()
def test_audio_clips_get_their_own_rows_and_a_resent_clip_is_not_encoded(encoders):
    tone, other, third = sample_audio(), sample_audio()[::-1].copy() * 0.5, sample_audio()[:8000]
    both, lens = clip_features(encoders, [tone, other])
    together = encoders.encode_audio(both, torch.tensor(lens)).embeds
    items = cached(encoders)
    found = items.audio(torch.from_numpy(np.concatenate([tone, other])), [len(tone), len(other)])
    assert [r.shape[0] for r in found] == [int(n) for n in _audio_rows(encoders, lens)]
    assert torch.equal(torch.cat(found), together)  # split per clip, nothing lost
    # The next turn: the second clip again, then a new one.
    turn, turn_lens = clip_features(encoders, [other, third])
    again = items.audio(torch.from_numpy(np.concatenate([other, third])), [len(other), len(third)])
    assert torch.equal(again[0], found[1])
    alone_rows = encoders.encode_audio(turn[:, turn_lens[0] :], torch.tensor(turn_lens[1:])).embeds
    assert torch.equal(again[1], alone_rows)
    assert items.cache.stats()["hits"] == 1 and items.cache.stats()["misses"] == 3


def _audio_rows(encoders, lens: list[int]) -> list[int]:
    """Rows per clip as the tower makes them, counted by encoding each clip alone."""
    out = []
    for n in lens:
        out.append(encoders.encode_audio(torch.zeros(128, n), torch.tensor([n])).embeds.shape[0])
    return out


@torch.no_grad()
def test_images_get_the_rows_they_get_alone(encoders):
    second = Image.fromarray(np.full((96, 64, 3), 200, np.uint8))
    items = cached(encoders)
    found = items.images([sample_image(), second])
    for rows, image in zip(found, [sample_image(), second], strict=True):
        out = encoders.encode_images([image])
        assert torch.equal(rows, torch.cat([out.embeds, *out.deepstack], -1))
    # the same images again, in the other order: all from the cache
    again = items.images([second, sample_image()])
    assert torch.equal(again[0], found[1]) and torch.equal(again[1], found[0])
    assert items.cache.stats() == {
        "hits": 2,
        "misses": 2,
        "items": 2,
        "bytes": sum(r.numel() * 4 for r in found),
    }


@torch.no_grad()
def test_videos_get_their_rows_and_a_resent_video_is_not_encoded(encoders):
    first, second = sample_video(), sample_video()[:2] // 2
    items = cached(encoders)
    found = items.videos([first, second])
    for rows, video in zip(found, [first, second], strict=True):
        out = encoders.encode_videos([video])
        assert torch.equal(rows, torch.cat([out.embeds, *out.deepstack], -1))
    assert torch.equal(items.videos([torch.from_numpy(second)])[0], found[1])
    assert items.cache.stats()["hits"] == 1
