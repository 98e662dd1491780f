"""The app's store of conversations' KV prefixes (``omni_serve.kv_store``), one replica shared
by every ingress replica.

Serve's proxy spreads HTTP requests over the ingress replicas, so a session's next turn often
reaches another ingress replica than its last one: a store inside each ingress would miss the
prefix that often (with four ingress replicas, three turns in four). One small replica holds
them instead; Serve replaces it if it dies, and the replacement finds the disk tier's pages
(a lost host tier only costs the next turns their handover: they compute, or hit the
Thinker's own prefix cache). Reaching it is one handle call per turn and one per reply, for
requests with a ``session_id``.
"""

from __future__ import annotations

import logging
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.common import ReleasesSharedMemory, edge_channel, stage_setup
from deployments.handle_calls import FAILED, call_cache
from omni_serve.kv_store.content_key import PromptContent
from omni_serve.kv_store.namespace import model_namespace
from omni_serve.kv_store.tiered_store import TieredPrefixStore
from omni_serve.transport.session_prefixes import free_prefix

log = logging.getLogger("ray.serve")
STORE_TIMEOUT_S = 5.0  # a store that does not answer (being replaced): the turn goes without


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=1000,
    ray_actor_options={"num_cpus": 0},
    health_check_period_s=10,
)
class SessionStore(ReleasesSharedMemory):
    def __init__(
        self,
        pipeline: dict[str, Any] | None,
        thinker: str = "thinker",
        store: TieredPrefixStore | None = None,
    ) -> None:
        """The store for ``pipeline``'s Thinker (``store``: one made already, for tests)."""
        if store is None:
            config, stage, model_path = stage_setup(pipeline, thinker)
            # The KV depends on the weights, the tokenizer and the dtype the Thinker runs in.
            salt = f"{stage.engine.dtype if stage.engine else ''}"
            store = TieredPrefixStore(
                config.kv_store,
                model_namespace(model_path, salt),
                edge_channel(config, thinker, "session_kv"),
            )
        self.store = store

    async def find(self, session_id: str | None, content: PromptContent | None) -> str | None:
        return await self.store.find(session_id, content)

    async def keep(
        self, session_id: str | None, encoded: str | None, content: PromptContent | None
    ) -> None:
        await self.store.keep(session_id, encoded, content)

    async def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def __del__(self) -> None:
        # Stopped with the app (or replaced gracefully): what only memory holds goes to disk
        # for the next store; the copies for the Thinker live in its own segment pool.
        spilled = self.store.spill(self.store.config.spill_on_stop_s)
        if spilled:
            log.info("KV store stopping: %d prefixes written to the disk tier", spilled)
        self.store.clear()
        super().__del__()


class SessionStoreClient:
    """The ingress's side: a store that fails or does not answer never fails a turn (the turn
    just goes without a prefix, and one it cannot keep is freed here)."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def find(self, session_id: str | None, content: PromptContent | None) -> str | None:
        if not session_id:
            return None
        args = (session_id, content)
        encoded = await call_cache(self.handle.find, *args, timeout_s=STORE_TIMEOUT_S)
        return None if encoded is FAILED else encoded

    async def keep(
        self, session_id: str | None, encoded: str | None, content: PromptContent | None
    ) -> None:
        if not session_id:  # nobody could ask for it
            free_prefix(encoded)
            return
        args = (session_id, encoded, content)
        kept = await call_cache(self.handle.keep, *args, timeout_s=STORE_TIMEOUT_S)
        if kept is FAILED:
            # Safe even if the store got it after all: a freed prefix loads as a miss (the
            # Thinker recomputes it) and a second free is a no-op.
            free_prefix(encoded)

    async def stats(self) -> dict[str, Any] | None:
        stats = await call_cache(self.handle.stats, timeout_s=STORE_TIMEOUT_S)
        return None if stats is FAILED else stats
