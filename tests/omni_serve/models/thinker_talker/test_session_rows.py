"""Rows a spoken turn keeps for the next one: when they may stand in for cached media, and the
rows the Talker then gets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_serve.models.thinker_talker.session_rows import (
    SessionRows,
    assemble,
    covers,
    digest,
    media_digests,
    rows_to_keep,
)

A, IMG = 90, 91  # audio and image placeholders
PLACEHOLDERS = {"audio": A, "image": IMG}
# Turn one: text, an audio clip (positions 2-4), text, the generation prompt.
TURN_ONE = [1, 2, A, A, A, 3, 4, 5]
TURN_TWO = [*TURN_ONE, 6, 7, A, A, 8]  # its reply, then a second clip (positions 10-11)
MEDIA_ONE = {"audio": ["clip-1"]}
MEDIA_TWO = {"audio": ["clip-1", "clip-2"]}


def kept() -> SessionRows:
    return SessionRows(TURN_ONE, MEDIA_ONE, ref=None, placeholders=PLACEHOLDERS)


@pytest.mark.parametrize(
    ("cached", "ids", "media", "expected"),
    [
        (0, TURN_TWO, MEDIA_TWO, True),  # nothing cached
        (6, TURN_TWO, MEDIA_TWO, True),  # the clip the kept rows hold
        (10, TURN_TWO, MEDIA_TWO, True),  # beyond turn one, but only text (its reply)
        (12, TURN_TWO, MEDIA_TWO, False),  # the second clip came from a cache
        (6, TURN_TWO, {"audio": ["other", "clip-2"]}, False),  # same placeholders, other audio
        (6, [1, 9, A, A, A, 3, 4, 5, 6, 7], MEDIA_TWO, False),  # an edited conversation
    ],
)
def test_kept_rows_cover_cached_media_only_of_the_same_tokens_and_items(
    cached, ids, media, expected
):
    assert covers(kept(), ids, media, cached) is expected


def test_the_talker_gets_kept_rows_at_cached_media_and_captured_rows_after():
    kept_rows = torch.tensor([[1.0], [2.0], [3.0]])  # turn one's clip, positions 2-4
    captured = torch.arange(8, 8 + len(TURN_TWO) - 8, dtype=torch.float32)[:, None] * 10
    full = assemble(kept(), kept_rows, captured, cached=8)
    assert full.shape == (len(TURN_TWO), 1)
    assert full[2:5, 0].tolist() == [1.0, 2.0, 3.0]
    assert torch.equal(full[8:], captured)
    assert full[[0, 1, 5, 6, 7], 0].tolist() == [0.0] * 5  # cached text: the Talker looks up


def test_nothing_cached_is_the_captured_rows():
    captured = torch.randn(len(TURN_ONE), 4)
    assert torch.equal(assemble(None, None, captured, cached=0), captured)


def test_a_turn_keeps_its_rows_at_media_positions_in_order():
    rows = torch.arange(len(TURN_TWO), dtype=torch.float32)[:, None]
    assert rows_to_keep(TURN_TWO, rows, PLACEHOLDERS)[:, 0].tolist() == [2, 3, 4, 10, 11]


def test_media_digests_follow_the_content_per_item():
    clip, other = np.zeros(160, np.float32), np.ones(160, np.float32)
    one = media_digests({"audio": (clip, 16000)})
    two = media_digests({"audio": [(clip, 16000), (other, 16000)]})
    assert one["audio"] == two["audio"][:1] and two["audio"][0] != two["audio"][1]
    assert media_digests({"audio": (clip, 8000)}) != one  # the rate is part of it
    spliced = media_digests(None, spliced=[(2, "rows:x")])
    assert spliced == {"audio": ["rows:x"]}
    grid = torch.tensor([[1, 2, 4], [1, 4, 4]])  # 2 and 4 rows after a 2x2 merge
    rows = torch.randn(6, 3)
    encoded = {"image": (rows, grid), "video": (rows[:4], [[2, 2, 4]])}  # video: 2x(2x4) / 4
    found = media_digests({"image": {"image_embeds": rows}}, None, encoded, merge_size=2)
    assert found["image"] == [digest(rows[:2]), digest(rows[2:])]
    assert found["video"] == [digest(rows[:4])]


def kept_everywhere() -> SessionRows:
    """Turn one's prompt and its reply's tokens (6, 7), rows kept at every position."""
    return SessionRows([*TURN_ONE, 6, 7], MEDIA_ONE, None, PLACEHOLDERS, everywhere=True)


@pytest.mark.parametrize(
    ("cached", "ids", "media", "expected"),
    [
        (8, TURN_TWO, MEDIA_TWO, True),  # turn one's prompt
        (10, TURN_TWO, MEDIA_TWO, True),  # and its reply: rows kept for it too
        (11, TURN_TWO, MEDIA_TWO, False),  # a cached text token with no kept row
        (6, TURN_TWO, {"audio": ["other", "clip-2"]}, False),  # same placeholders, other audio
        (4, [1, 9, A, A, A, 3, 4, 5, 6, 7], MEDIA_TWO, False),  # an edited conversation
    ],
)
def test_rows_kept_everywhere_cover_every_cached_position_they_hold(cached, ids, media, expected):
    assert covers(kept_everywhere(), ids, media, cached) is expected


def test_rows_kept_everywhere_stand_in_at_every_cached_position():
    kept_rows = torch.arange(1, 11, dtype=torch.float32)[:, None]  # positions 0-9
    captured = torch.full((len(TURN_TWO) - 9, 1), -1.0)
    full = assemble(kept_everywhere(), kept_rows, captured, cached=9)
    assert full[:9, 0].tolist() == list(range(1, 10)) and torch.equal(full[9:], captured)


def test_a_turn_keeping_rows_everywhere_keeps_them_all_up_to_its_ids():
    rows = torch.arange(len(TURN_TWO) + 1, dtype=torch.float32)[:, None]  # one row ahead
    kept_rows = rows_to_keep(TURN_TWO, rows, PLACEHOLDERS, everywhere=True)
    assert kept_rows[:, 0].tolist() == list(range(len(TURN_TWO)))
