"""KV-block payloads: gather/scatter on both vLLM cache layouts, prefix matching, the wire form."""

from __future__ import annotations

import pytest
import torch

from omni_serve.transport import make_channel, shm_pool, take
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import KVPrefix, put_prefix, scatter

NUM_BLOCKS, BLOCK = 8, 4


def _caches(layout: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = {"cpu": (NUM_BLOCKS, 2, BLOCK, 16), "kv_first": (2, NUM_BLOCKS, BLOCK, 2, 8)}[layout]
    return {f"layers.{i}.attn": torch.randn(shape, generator=gen) for i in range(3)}


@pytest.mark.parametrize("backend", ["shared_memory", "inline"])
@pytest.mark.parametrize("layout", ["cpu", "kv_first"])
async def test_blocks_move_from_one_cache_into_other_block_ids_of_another(layout, backend):
    source, target = _caches(layout), {k: torch.zeros_like(v) for k, v in _caches(layout).items()}
    dims = dict.fromkeys(source, {"cpu": 0, "kv_first": 1}[layout])
    tokens = list(range(3 * BLOCK + 1))
    prefix = put_prefix(make_channel(backend), source, dims, [5, 1, 6], tokens, BLOCK, [])
    assert prefix.num_blocks == 3 and prefix.token_ids == tokens[: 3 * BLOCK]
    wire = KVPrefix.decode(prefix.encode())
    scatter(await take(wire.ref), target, dims, [0, 7], first=1)  # the first block hit locally
    for name in source:
        dim = dims[name]
        for src, dst in ((1, 0), (6, 7)):
            assert torch.equal(source[name].select(dim, src), target[name].select(dim, dst))
        assert not target[name].select(dim, 1).any()  # untouched


def test_an_export_that_fails_midway_gives_its_segment_back(monkeypatch):
    pool = shm_pool.SegmentPool()
    monkeypatch.setattr(shm, "_pool", pool)
    source = _caches("cpu")
    dims = {k: 0 for k in source}
    with pytest.raises(IndexError):  # block 99 does not exist
        put_prefix(make_channel("shared_memory"), source, dims, [1, 99], [0] * 8, BLOCK, [])
    (segment,) = pool.segments.values()
    assert segment.state()[1] == shm.FREE
    pool.close()


def test_scatter_refuses_blocks_from_another_model():
    caches = _caches("cpu")
    with pytest.raises(ValueError, match="lack layers"):
        scatter({"other.0": torch.zeros(1)}, caches, dict.fromkeys(caches, 0), [0])


@pytest.mark.parametrize(
    ("prompt", "mm", "expected"),
    [
        (list(range(20)), [(5, "img-a")], 12),  # all 12 prefix tokens: 3 whole blocks
        (list(range(12)), [(5, "img-a")], 8),  # the prompt's last token is always computed
        ([*range(6), 99, *range(7, 20)], [(5, "img-a")], 4),  # differs inside block 1
        (list(range(20)), [(5, "img-b")], 4),  # another image from token 5: block 0 only
        (list(range(20)), [(2, "img-b")], 0),  # another image inside block 0
        (list(range(20)), [(5, "img-a"), (10, "img-c")], 8),  # an item the prefix lacks
        (list(range(20)), [(5, "img-a"), (14, "img-c")], 12),  # a later item does not matter
        (list(range(20)), [], 4),  # the prefix's image is not in this prompt
    ],
)
def test_matching_tokens_stop_at_the_first_token_or_media_item_that_differs(prompt, mm, expected):
    prefix = KVPrefix(list(range(12)), BLOCK, None, ["img-a"], mm_offsets=[5])  # type: ignore[arg-type]
    assert prefix.matching_tokens(prompt, mm) == expected


@pytest.mark.parametrize(
    ("mm", "expected"), [([(5, "img-a")], 12), ([(5, "img-b")], 0), ([(9, "img-a")], 12)]
)
def test_a_prefix_without_media_offsets_matches_only_the_same_items(mm, expected):
    prefix = KVPrefix(list(range(12)), BLOCK, ref=None, mm_ids=["img-a"])  # type: ignore[arg-type]
    assert prefix.matching_tokens(list(range(20)), mm) == expected


@pytest.mark.parametrize(
    ("spans_hosts", "nixl", "expected"),
    [(False, True, None), (True, True, "shared_memory_direct"), (True, False, None)],
)
def test_an_export_made_outside_ray_is_lent_to_nixl_while_the_cluster_spans_hosts(
    monkeypatch, spans_hosts, nixl, expected
):
    """Named by the Thinker for its engine, which cannot see the hosts (a replica on the
    engine's host maps the export, one on another reads it over NIXL); one host: the engine's
    own choice (shared memory); no NIXL: nothing crosses hosts from there (the object store
    needs Ray), the next turn recomputes."""
    import time

    from omni_serve.compat import nixl as nixl_compat
    from omni_serve.transport import AutoChannel, SharedMemoryChannel
    from omni_serve.transport.kv_blocks import export_backend

    monkeypatch.setattr(nixl_compat, "nixl_available", lambda: nixl)
    auto = AutoChannel()
    auto._local, auto._checked = not spans_hosts, time.monotonic()  # as checked a moment ago
    assert export_backend(auto) == expected
    assert export_backend(SharedMemoryChannel()) is None  # a pinned edge: the engine pins it too
