"""Routing decisions: a conversation keeps its replica, keys spread over replicas, a removed
replica moves only its own keys, and an overloaded preferred replica is skipped."""

from __future__ import annotations

import collections

from omni_serve.routing import policy

REPLICAS = ["r0", "r1", "r2", "r3"]
MAX = dict.fromkeys(REPLICAS, 8)


def test_turns_of_one_conversation_share_a_key_and_different_ones_do_not():
    system = list(range(100, 180))  # system prompt + first user turn: 80 tokens
    turn1 = {"prompt_ids": system + [1, 2]}
    turn2 = {"prompt_ids": system + [1, 2, 3, 4, 5, 6]}
    other = {"prompt_ids": [7] + system}
    assert policy.affinity_key(turn1) == policy.affinity_key(turn2) is not None
    assert policy.affinity_key(other) != policy.affinity_key(turn1)
    assert policy.affinity_key({"prompt_ids": [1, 2, 3]}) is None  # nothing worth caching
    assert policy.affinity_key({"prompt_ids": [1], "session_id": "s1"}) == "session:s1"
    # OpenAI's prompt_cache_key groups requests too; a session id goes first
    assert policy.affinity_key({**turn1, "cache_key": "k"}) == "cache:k"
    assert policy.affinity_key({"cache_key": "k", "session_id": "s1"}) == "session:s1"
    assert policy.affinity_key(["not", "a", "request"]) is None


def test_a_streams_decode_jobs_share_its_key():
    """Code2wav keeps each stream's transformer state: its jobs go where the state is."""
    job = collections.namedtuple("Job", "stream_id")
    assert policy.affinity_key([job("s1"), job("s1")]) == policy.affinity_key([job("s1")])
    assert policy.affinity_key([job("s1")]) == "stream:s1"
    assert policy.affinity_key([job(None)]) is None and policy.affinity_key([]) is None


def test_keys_spread_over_replicas_and_a_removed_replica_moves_only_its_keys():
    keys = [f"session:{i}" for i in range(400)]
    owner = {k: policy.rendezvous_order(k, REPLICAS)[0] for k in keys}
    counts = collections.Counter(owner.values())
    assert set(counts) == set(REPLICAS) and min(counts.values()) > 60
    shrunk = {k: policy.rendezvous_order(k, ["r0", "r1", "r3"])[0] for k in keys}
    moved = [k for k in keys if shrunk[k] != owner[k]]
    assert moved and all(owner[k] == "r2" for k in moved)


def test_the_preferred_replica_is_tried_first_while_it_has_room():
    key = "session:abc"
    preferred = policy.rendezvous_order(key, REPLICAS)[0]
    lens = {r: 1 for r in REPLICAS}
    ranks = policy.affinity_ranks(key, lens, MAX)
    assert ranks == [[preferred], policy.least_loaded(lens)[0]]


def test_an_overloaded_or_full_preferred_replica_falls_back_to_least_loaded():
    key = "session:abc"
    preferred = policy.rendezvous_order(key, REPLICAS)[0]
    busy = {r: (6 if r == preferred else 1) for r in REPLICAS}
    assert policy.affinity_ranks(key, busy, MAX, imbalance_threshold=4) == policy.least_loaded(busy)
    full = {r: (8 if r == preferred else 7) for r in REPLICAS}
    assert preferred not in policy.affinity_ranks(key, full, MAX)[0][:1]


def test_least_loaded_offers_every_replica_shortest_queue_first():
    assert policy.least_loaded({"a": 3, "b": None, "c": 0}) == [["b", "c", "a"]]
    assert policy.affinity_ranks(None, {"a": 3, "b": 1}, {"a": 8, "b": 8}) == [["b", "a"]]


def test_replicas_on_the_callers_node_come_first_while_their_queue_is_near_the_shortest():
    lens = {"here": 2, "there": 0, "there_too": 1}
    assert policy.least_loaded(lens, local={"here"}) == [["here"], ["there", "there_too"]]
    busy = {"here": 3, "there": 0, "there_too": 1}  # 3 > 0 + slack 2: load wins
    assert policy.least_loaded(busy, local={"here"}) == [["there", "there_too", "here"]]
    assert policy.least_loaded(lens, local={"here"}, local_slack=-1) == [
        ["there", "there_too", "here"]
    ]
    unknown = {"here": None, "there": 5}  # not probed yet: counted as empty
    assert policy.least_loaded(unknown, local={"here"}) == [["here"], ["there"]]
    everywhere = {"a": 1, "b": 0}  # every replica local: one rank
    assert policy.least_loaded(everywhere, local={"a", "b"}) == [["b", "a"]]


def test_a_conversations_replica_outranks_locality_and_locality_orders_the_fallback():
    key = "session:abc"
    preferred = policy.rendezvous_order(key, REPLICAS)[0]
    here = next(r for r in REPLICAS if r != preferred)
    lens = {r: 1 for r in REPLICAS}
    ranks = policy.affinity_ranks(key, lens, MAX, local={here})
    assert ranks[0] == [preferred] and ranks[1] == [here]
    assert sorted(ranks[2]) == sorted(r for r in REPLICAS if r != here)
