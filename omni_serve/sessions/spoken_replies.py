"""Transcripts of spoken replies, kept under their audio ids for a later turn to name.

OpenAI's multi-turn audio sends an earlier spoken reply back as ``{"role": "assistant",
"audio": {"id": ...}}``, without its text, until the reply's ``expires_at``. The Thinker only
ever hears its own earlier turns as text, so the transcript is all a reply needs to be named:
a few KB, kept for ``ttl_s`` and bounded in bytes (least recently used dropped first). A reply
no longer kept is a 400 asking for its text, never a turn that silently loses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TTLCache


def _nbytes(transcript: str) -> int:
    return len(transcript.encode()) + 64  # the key and entry, roughly


class SpokenReplies:
    def __init__(
        self, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._kept: TTLCache[str, str] | None = None
        if ttl_s > 0 and max_bytes > 0:
            self._kept = TTLCache(max_bytes, ttl_s, timer=clock, getsizeof=_nbytes)

    def __len__(self) -> int:
        return 0 if self._kept is None else len(self._kept)

    @property
    def nbytes(self) -> int:
        return 0 if self._kept is None else int(self._kept.currsize)

    def keep(self, audio_id: str, transcript: str) -> bool:
        """Whether it is kept: not with ``ttl_s`` 0, nor one larger than the whole store."""
        if self._kept is None or _nbytes(transcript) > self._kept.maxsize:
            return False
        self._kept[audio_id] = transcript
        return True

    def transcript(self, audio_id: str) -> str | None:
        """The reply's text, or None when it was never kept here, expired or was dropped."""
        return None if self._kept is None else self._kept.get(audio_id)
