"""Serve request routers over ``policy``. Named in a pipeline config as a stage's
``deployment.request_router`` (``least_loaded``, ``affinity``); Serve builds one per caller
(each ingress replica, each Talker replica calling the Thinker) from its import path. Both
rank replicas on the caller's node first within ``local_slack`` (``request_router_kwargs``;
-1 turns it off): Serve's ``LocalityMixin`` says which those are."""

from __future__ import annotations

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

from omni_serve.routing import policy


def _queue_lens(router: RequestRouter, replicas: list[RunningReplica]) -> dict[str, int | None]:
    cache = router.replica_queue_len_cache
    return {r.replica_id.unique_id: cache.get(r.replica_id) for r in replicas}


def _local(router: LocalityMixin, replicas: list[RunningReplica]) -> set[str]:
    """The replicas on the caller's node (Serve's first locality rank)."""
    return {r.replica_id.unique_id for r in router.rank_replicas_via_locality(replicas)[0]}


class LeastLoadedRouter(LocalityMixin, FIFOMixin, RequestRouter):
    """Every replica is a candidate; Serve sends to the one with the shortest queue (probing
    those it has no recent length for). For stages whose requests vary a lot in cost (codec
    chunks, VAE decodes), where two random choices often pick a busy replica."""

    def initialize_state(self, local_slack: int = policy.DEFAULT_LOCAL_SLACK) -> None:
        self.local_slack = local_slack

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        ranks = policy.least_loaded(
            _queue_lens(self, candidate_replicas),
            _local(self, candidate_replicas),
            self.local_slack,
        )
        return [[by_id[i] for i in rank] for rank in ranks]


class AffinityRouter(LocalityMixin, FIFOMixin, RequestRouter):
    """Session/prefix affinity (see ``policy``), for the Thinker: a conversation's turns reach
    the replica holding its prefix cache, unless that replica is overloaded."""

    def initialize_state(
        self,
        prefix_tokens: int = policy.DEFAULT_PREFIX_TOKENS,
        imbalance_threshold: int = policy.DEFAULT_IMBALANCE_THRESHOLD,
        local_slack: int = policy.DEFAULT_LOCAL_SLACK,
    ) -> None:
        self.prefix_tokens = prefix_tokens
        self.imbalance_threshold = imbalance_threshold
        self.local_slack = local_slack

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = None
        if pending_request is not None and pending_request.args:
            key = policy.affinity_key(pending_request.args[0], self.prefix_tokens)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        max_ongoing = {i: r.max_ongoing_requests for i, r in by_id.items()}
        ranks = policy.affinity_ranks(
            key,
            _queue_lens(self, candidate_replicas),
            max_ongoing,
            self.imbalance_threshold,
            _local(self, candidate_replicas),
            self.local_slack,
        )
        return [[by_id[i] for i in rank] for rank in ranks]
