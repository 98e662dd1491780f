"""The latest KV prefix each conversation exported, so that its next turn skips that prefill on
whichever Thinker replica it lands.

Affinity routing keeps a session on one replica while that replica has room; a turn sent
elsewhere (the replica is busy, was replaced, or the Thinker scaled) would compute the whole
conversation again. With the Thinker's ``session_kv`` edge on, every turn of a session exports
its prompt's KV blocks to the tensor channel, the ingress keeps the newest export per session
here, and the next turn carries it: the replica that already holds the prefix in its own cache
drops it, any other loads it (``omni_serve.engines.ar.kv_connector``).

A kept prefix holds a channel buffer (one of the Thinker's pooled shared-memory segments, on
one host), so the store is bounded in bytes: past ``max_bytes`` (or ``max_sessions``) the least
recently used session's prefix is freed, and one older than ``ttl_s`` is freed when it is next
looked at or when the store is next written (the producer's lease would reclaim it later
anyway).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from omni_serve.transport import release
from omni_serve.transport.kv_blocks import KVPrefix

log = logging.getLogger(__name__)
DEFAULT_MAX_SESSIONS = 4096
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_TTL_S = 300.0


def decode_prefix(encoded: str | None) -> KVPrefix | None:
    """The prefix, or None for none or an unreadable one (logged)."""
    if not encoded:
        return None
    try:
        return KVPrefix.decode(encoded)
    except ValueError as exc:
        log.warning("unreadable KV prefix (%s): its lease reclaims its buffer", exc)
        return None


def free_prefix(encoded: str | None) -> None:
    """Hand back the buffer of an encoded prefix nobody will load."""
    prefix = decode_prefix(encoded)
    if prefix is not None:
        release(*prefix.refs())


@dataclass
class _Kept:
    encoded: str
    nbytes: int
    kept_at: float


class SessionPrefixes:
    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.nbytes = 0
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def pop(self, session_id: str | None) -> str | None:
        """The session's prefix, now the caller's to load (or free)."""
        kept = self._take(session_id)
        if kept is None:
            return None
        if time.monotonic() - kept.kept_at > self.ttl_s:
            free_prefix(kept.encoded)
            return None
        return kept.encoded

    def keep(self, session_id: str | None, encoded: str | None) -> None:
        """Keep the session's newest prefix (freeing the one it replaces); without a session,
        nobody could ask for it: freed at once."""
        old = self._take(session_id)
        if old is not None:
            free_prefix(old.encoded)
        prefix = decode_prefix(encoded)
        if prefix is None:
            return
        nbytes = sum(ref.nbytes for ref in prefix.refs())
        if not session_id or nbytes > self.max_bytes:
            release(*prefix.refs())
            return
        self._kept[session_id] = _Kept(encoded, nbytes, time.monotonic())
        self.nbytes += nbytes
        self._evict()

    def clear(self) -> None:
        while self._kept:
            self._free_oldest()

    def _take(self, session_id: str | None) -> _Kept | None:
        kept = self._kept.pop(session_id, None) if session_id else None
        if kept is not None:
            self.nbytes -= kept.nbytes
        return kept

    def _evict(self) -> None:
        now = time.monotonic()
        while self._kept and (
            self.nbytes > self.max_bytes
            or len(self._kept) > self.max_sessions
            or now - next(iter(self._kept.values())).kept_at > self.ttl_s
        ):
            self._free_oldest()

    def _free_oldest(self) -> None:
        _, kept = self._kept.popitem(last=False)
        self.nbytes -= kept.nbytes
        free_prefix(kept.encoded)
