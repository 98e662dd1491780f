"""Routing decisions as plain functions of queue lengths, testable without Serve.

Affinity: the requests of one conversation should reach the replica whose engine already
holds their prefix in its KV cache (vLLM prefix caching), so a multi-turn request recomputes
only its new turn (a spoken reply to a prompt with media still computes all of it: the Talker
needs the Thinker's rows of every media position). A turn sent elsewhere can load the KV its
previous turn exported (the pipeline's ``session_kv`` edge). A request's affinity key is its
``session_id`` when the client sent one, else its ``cache_key`` (OpenAI's ``prompt_cache_key``),
else a hash of its first ``prefix_tokens`` prompt
tokens (the system prompt and first user turn, shared by every later turn of the
conversation). Keys map to replicas by rendezvous
hashing, so adding or removing a replica moves only the keys that replica owned. When the
preferred replica is full, or busier than the least-loaded one by more than
``imbalance_threshold`` requests, the request goes to the least-loaded replica instead.

Locality: a stage's payload reaches the next stage as a ref to memory on the caller's host.
A replica on that host maps it; one on another host reads it over the network (16 MB between
two hosts made of namespaces here: 5.3-5.5 GB/s mapped, 0.9-1.0 over TCP; docs/benchmarks.md).
So replicas on the caller's Ray node come first while their queues are within ``local_slack``
requests of the shortest anywhere; past that, load wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

DEFAULT_PREFIX_TOKENS = 64
DEFAULT_IMBALANCE_THRESHOLD = 4
DEFAULT_LOCAL_SLACK = 2


def affinity_key(request: Any, prefix_tokens: int = DEFAULT_PREFIX_TOKENS) -> str | None:
    """The key of a stage request: a message (or dict) with ``session_id``, ``cache_key``
    and/or ``prompt_ids``, or a list of codec decode jobs of one stream (their ``stream_id``:
    the replica holding the stream's decoder state)."""
    if isinstance(request, list) and request and getattr(request[0], "stream_id", None):
        return f"stream:{request[0].stream_id}"
    if session_id := _field(request, "session_id"):
        return f"session:{session_id}"
    if cache_key := _field(request, "cache_key"):
        return f"cache:{cache_key}"
    ids = _field(request, "prompt_ids")
    if not isinstance(ids, Sequence) or len(ids) < prefix_tokens:
        return None  # too short to share a cached prefix worth routing for
    head = ",".join(str(int(t)) for t in ids[:prefix_tokens])
    return "prefix:" + hashlib.blake2b(head.encode(), digest_size=8).hexdigest()


def _field(request: Any, name: str) -> Any:
    if isinstance(request, Mapping):
        return request.get(name)
    return getattr(request, name, None)


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """Replicas from most to least preferred for ``key`` (highest random weight hashing)."""

    def weight(replica_id: str) -> int:
        digest = hashlib.blake2b(f"{key}|{replica_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return sorted(replica_ids, key=weight, reverse=True)


def least_loaded(
    queue_lens: Mapping[str, int | None],
    local: Collection[str] = (),
    local_slack: int = DEFAULT_LOCAL_SLACK,
) -> list[list[str]]:
    """Every replica, shortest known queue first: Serve probes the queue length of each
    replica of a rank (or reads its cache of them) and sends to the shortest with room. The
    ``local`` replicas (on the caller's node) whose queue is within ``local_slack`` of the
    shortest come first as a rank of their own; a negative ``local_slack`` turns that off."""
    ordered = sorted(queue_lens, key=lambda r: -1 if queue_lens[r] is None else queue_lens[r])
    if local_slack < 0 or not local:
        return [ordered]
    known = [q for q in queue_lens.values() if q is not None]
    lightest = min(known, default=0)
    near = [r for r in ordered if r in local and (queue_lens[r] or 0) <= lightest + local_slack]
    rest = [r for r in ordered if r not in near]
    return [near, rest] if near and rest else [ordered]


def affinity_ranks(
    key: str | None,
    queue_lens: Mapping[str, int | None],
    max_ongoing: Mapping[str, int],
    imbalance_threshold: int = DEFAULT_IMBALANCE_THRESHOLD,
    local: Collection[str] = (),
    local_slack: int = DEFAULT_LOCAL_SLACK,
) -> list[list[str]]:
    """Ranks of replicas to try: the key's replica alone first while it has room and is not
    much busier than the rest (its prefix cache is worth more than locality), then the
    others as ``least_loaded`` ranks them."""
    fallback = least_loaded(queue_lens, local, local_slack)
    if key is None or not queue_lens:
        return fallback
    preferred = rendezvous_order(key, list(queue_lens))[0]
    load = queue_lens[preferred]
    known = [q for q in queue_lens.values() if q is not None]
    lightest = min(known) if known else 0
    if load is not None and (
        load >= max_ongoing[preferred] or load - lightest > imbalance_threshold
    ):
        return fallback
    return [[preferred], *fallback]
