"""The app's store of sessions' KV prefixes, one replica shared by every ingress replica.

Serve's proxy spreads HTTP requests over the ingress replicas, so a session's next turn often
reaches another ingress replica than its last one: a store inside each ingress would miss the
prefix that often (with four ingress replicas, three turns in four) and keep the missed ones
until their TTL. One small replica holds them instead; Serve replaces it if it dies, and a
lost store only costs the next turns their handover (they compute, or hit the Thinker's own
prefix cache). Reaching it is one handle call per turn, for requests with a ``session_id``.
"""

from __future__ import annotations

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.handle_calls import FAILED, call_cache
from omni_serve.transport.session_prefixes import SessionPrefixes, free_prefix

STORE_TIMEOUT_S = 5.0  # a store that does not answer (being replaced): the turn goes without


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=1000,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=10,
)
class SessionStore:
    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.prefixes = SessionPrefixes(max_bytes, ttl_s)

    async def pop(self, session_id: str) -> str | None:
        return self.prefixes.pop(session_id)

    async def keep(self, session_id: str, encoded: str | None) -> None:
        self.prefixes.keep(session_id, encoded)

    async def stats(self) -> dict[str, int]:
        return {"prefixes": len(self.prefixes), "bytes": self.prefixes.nbytes}

    def __del__(self) -> None:
        # Deleting the app: hand the buffers back now rather than after the producers' lease.
        self.prefixes.clear()


class SessionStoreClient:
    """The ingress's side: a store that fails or does not answer never fails a turn (the turn
    just goes without a prefix, and one it cannot keep is freed here)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def pop(self, session_id: str | None) -> str | None:
        if not session_id:
            return None
        encoded = await call_cache(self.handle.pop, session_id, timeout_s=STORE_TIMEOUT_S)
        return None if encoded is FAILED else encoded

    async def keep(self, session_id: str | None, encoded: str | None) -> None:
        if not session_id:  # nobody could ask for it
            free_prefix(encoded)
            return
        kept = await call_cache(self.handle.keep, session_id, encoded, timeout_s=STORE_TIMEOUT_S)
        if kept is FAILED:
            # Safe even if the store got it after all: a freed prefix loads as a miss (the
            # Thinker recomputes it) and a second free is a no-op.
            free_prefix(encoded)

    async def stats(self) -> dict[str, int]:
        stats = await call_cache(self.handle.stats, timeout_s=STORE_TIMEOUT_S)
        return {"prefixes": 0, "bytes": 0} if stats is FAILED else stats
