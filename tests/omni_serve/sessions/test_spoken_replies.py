"""The transcripts kept under spoken replies' audio ids: found until the reply's TTL, bounded
in bytes with the least recently used dropped first, none kept when the TTL is 0."""

from __future__ import annotations

from omni_serve.sessions.spoken_replies import SpokenReplies


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_transcript_is_found_by_its_audio_id_until_its_ttl():
    clock = Clock()
    replies = SpokenReplies(ttl_s=60, max_bytes=1 << 20, clock=clock)
    assert replies.keep("audio-1", "Hello there.")
    assert replies.transcript("audio-1") == "Hello there."
    assert replies.transcript("audio-2") is None
    assert len(replies) == 1 and replies.nbytes > len("Hello there.")
    clock.now = 59.0
    assert replies.transcript("audio-1") == "Hello there."
    clock.now = 60.5
    assert replies.transcript("audio-1") is None


def test_past_max_bytes_the_least_recently_used_goes_first():
    replies = SpokenReplies(ttl_s=3600, max_bytes=3 * (100 + 64))
    for name in "abc":
        assert replies.keep(name, name * 100)
    assert replies.transcript("a") == "a" * 100  # used: now b is the least recent
    assert replies.keep("d", "d" * 100)
    assert replies.transcript("b") is None
    assert [replies.transcript(n) for n in "acd"] == ["a" * 100, "c" * 100, "d" * 100]
    assert replies.nbytes <= 3 * (100 + 64)


def test_none_is_kept_with_ttl_0_nor_one_larger_than_the_store():
    off = SpokenReplies(ttl_s=0, max_bytes=1 << 20)
    assert not off.keep("audio-1", "Hi.") and off.transcript("audio-1") is None
    assert len(off) == 0 and off.nbytes == 0
    small = SpokenReplies(ttl_s=60, max_bytes=100)
    assert not small.keep("audio-1", "x" * 100)  # with its overhead it would not fit
    assert small.keep("audio-2", "Hi.") and small.transcript("audio-2") == "Hi."
    # counted in bytes, not characters: 20 'é' are 40 bytes, 20 'e' 20
    assert not SpokenReplies(ttl_s=60, max_bytes=100).keep("audio-3", "é" * 20)
    assert SpokenReplies(ttl_s=60, max_bytes=100).keep("audio-3", "e" * 20)
