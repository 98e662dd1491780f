"""The latest KV prefix each conversation exported, so that its next turn skips that prefill on
whichever Thinker replica it lands.

Affinity routing keeps a session on one replica while that replica has room; a turn sent
elsewhere (the replica is busy, was replaced, or the Thinker scaled) would compute the whole
conversation again. With the Thinker's ``session_kv`` edge on, every turn of a session exports
its prompt's KV blocks to the tensor channel, the ingress keeps the newest export per session
here, and the next turn carries it: the replica that already holds the prefix in its own cache
drops it, any other loads it (``omni_serve.engines.ar.kv_connector``).

A kept prefix holds a channel buffer, so the store is bounded: past ``max_sessions`` the least
recently used session's prefix is freed, and one older than ``ttl_s`` is freed when it is next
looked at (the producer's lease would reclaim it later anyway).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import OrderedDict

from omni_serve.transport import release
from omni_serve.transport.kv_blocks import KVPrefix

log = logging.getLogger(__name__)
DEFAULT_MAX_SESSIONS = 256
DEFAULT_TTL_S = 300.0


def free_prefix(encoded: str | None) -> None:
    """Hand back the buffer of an encoded prefix nobody will load."""
    if not encoded:
        return
    try:
        release(KVPrefix.decode(encoded).ref)
    except (ValueError, TypeError, EOFError, AttributeError, pickle.UnpicklingError) as exc:
        log.warning("unreadable KV prefix not freed (%s): its lease reclaims it", exc)


class SessionPrefixes:
    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS, ttl_s: float = DEFAULT_TTL_S):
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._kept: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def pop(self, session_id: str | None) -> str | None:
        """The session's prefix, now the caller's to load (or free)."""
        if not session_id or session_id not in self._kept:
            return None
        encoded, kept_at = self._kept.pop(session_id)
        if time.monotonic() - kept_at > self.ttl_s:
            free_prefix(encoded)
            return None
        return encoded

    def keep(self, session_id: str | None, encoded: str | None) -> None:
        """Keep the session's newest prefix (freeing the one it replaces); without a session,
        nobody could ask for it: freed at once."""
        if not session_id:
            free_prefix(encoded)
            return
        old = self._kept.pop(session_id, None)
        if old is not None:
            free_prefix(old[0])
        if not encoded:
            return
        self._kept[session_id] = (encoded, time.monotonic())
        while len(self._kept) > self.max_sessions:
            _, (evicted, _) = self._kept.popitem(last=False)
            free_prefix(evicted)

    def clear(self) -> None:
        while self._kept:
            free_prefix(self._kept.popitem()[1][0])
