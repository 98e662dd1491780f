from __future__ import annotations

import asyncio

import torch

from omni_serve.config.kv_store import KVStoreConfig
from omni_serve.kv_store.content_key import PromptContent
from omni_serve.kv_store.tiered_store import TieredPrefixStore
from omni_serve.transport import shared_memory as shm
from omni_serve.transport import take
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.shared_memory import SharedMemoryChannel
from tests.omni_serve.kv_store.conftest import BLOCK, exported, kv_blocks

SYSTEM = list(range(1000, 1064))  # a shared system prompt: 8 content blocks of 8
TURN = [*SYSTEM, *range(1, 33)]
ONE = sum(t.numel() * 4 for t in kv_blocks(len(TURN), 0).values())


def _store(tmp_path, channel, host_prefixes: float = 10, **over) -> TieredPrefixStore:
    config = KVStoreConfig(
        host_max_bytes=int(host_prefixes * ONE),
        disk_path=str(tmp_path),
        block_tokens=8,
        prefill_tokens_per_s=1e9 if over.pop("fast_prefill", False) else 1.0,
        **over,
    )
    return TieredPrefixStore(config, "ns", channel)


async def _loaded(encoded: str | None) -> tuple[KVPrefix, dict[str, torch.Tensor]]:
    assert encoded is not None
    prefix = KVPrefix.decode(encoded)
    return prefix, await take(prefix.ref)


def _content(tokens, media=((1, "img"),)) -> PromptContent:
    return PromptContent(list(tokens), list(media))


async def test_a_sessions_next_turn_gets_its_own_prefix_from_memory(tmp_path, channel):
    store = _store(tmp_path, channel)
    await store.keep("a", exported(channel, TURN, seed=1), _content(TURN))
    prefix, blocks = await _loaded(await store.find("a", _content([*TURN, 5, 6, 7])))
    assert prefix.token_ids == TURN and prefix.mm_offsets == [1]
    for name, t in kv_blocks(len(TURN), 1).items():
        assert torch.equal(blocks[name], t)
    assert store.stats()["host"]["hits"] == 1
    again, _ = await _loaded(await store.find("a", _content(TURN)))  # still kept: a copy
    assert again.ref.key != prefix.ref.key


async def test_another_session_with_the_same_system_prompt_and_image_reuses_it(tmp_path, channel):
    store = _store(tmp_path, channel)
    await store.keep("a", exported(channel, TURN, seed=1), _content(TURN))
    other = [*SYSTEM, 77, 78, 79, 80, 81, 82, 83, 84, 85]
    prefix, _ = await _loaded(await store.find("b", _content(other)))
    assert prefix.token_ids == TURN  # the engine loads the blocks the prompts share
    assert await store.find("c", _content(other, [(1, "another-image")])) is None
    assert await store.find("d", _content([9, *SYSTEM])) is None  # differs from token 0
    assert store.stats()["misses"] == 2


async def test_a_prefix_pushed_out_of_memory_comes_back_from_disk_bit_exact(tmp_path, channel):
    store = _store(tmp_path, channel, host_prefixes=1.5)
    await store.keep("a", exported(channel, TURN, seed=1), _content(TURN))
    turn_b = [*range(500, 596)]
    await store.keep("b", exported(channel, turn_b, seed=2), _content(turn_b))  # pushes a out
    stats = store.stats()
    assert stats["host"]["prefixes"] == 1 and stats["host"]["evictions"] == 1
    assert stats["host"]["bytes"] <= stats["host"]["max_bytes"]
    prefix, blocks = await _loaded(await store.find("a", _content(TURN)))
    for name, t in kv_blocks(len(TURN), 1).items():
        assert torch.equal(blocks[name], t)
    stats = store.stats()
    assert stats["disk"]["hits"] == 1 and stats["disk"]["load_seconds"] > 0
    assert stats["host"]["bytes"] <= stats["host"]["max_bytes"]


async def test_a_restarted_store_keeps_its_disk_tier(tmp_path, channel):
    store = _store(tmp_path, channel, host_prefixes=0.5)  # nothing stays in memory
    await store.keep("a", exported(channel, TURN, seed=3), _content(TURN))
    store.disk.flush()
    restarted = _store(tmp_path, channel)
    assert restarted.stats()["disk"]["prefixes"] == 1
    _, blocks = await _loaded(await restarted.find("a", _content(TURN)))
    for name, t in kv_blocks(len(TURN), 3).items():
        assert torch.equal(blocks[name], t)
    other_model = TieredPrefixStore(restarted.config, "another-model", channel)
    assert await other_model.find("a", _content(TURN)) is None


async def _kept_on_disk(tmp_path, channel, **over) -> TieredPrefixStore:
    """A store whose memory keeps nothing, holding TURN's prefix (seed 3) as a written page."""
    store = _store(tmp_path, channel, host_prefixes=0.5, **over)
    await store.keep("a", exported(channel, TURN, seed=3), _content(TURN))
    store.disk.flush()
    return store


async def test_a_prefix_cheaper_to_compute_than_to_read_is_left_on_disk(tmp_path, channel):
    store = await _kept_on_disk(tmp_path, channel, fast_prefill=True)
    assert await store.find("a", _content(TURN)) is None
    assert store.stats()["declined"] == 1 and store.stats()["disk"]["hits"] == 0


async def test_a_damaged_page_is_recomputed_and_forgotten(tmp_path, channel):
    store = await _kept_on_disk(tmp_path, channel)
    (page,) = store.disk._pages.values()
    data = bytearray(page.path.read_bytes())
    data[-1] ^= 1
    page.path.write_bytes(bytes(data))
    assert await store.find("a", _content(TURN)) is None
    assert store.stats()["prefixes"] == 0 and store.stats()["disk"]["refused"] == 1


async def test_a_sessions_new_turn_replaces_its_last_prefix_everywhere(tmp_path, channel):
    store = await _kept_on_disk(tmp_path, channel)
    longer = [*TURN, *range(40, 48)]
    await store.keep("a", exported(channel, longer, seed=4), _content(longer))
    store.disk.flush()
    assert store.stats()["prefixes"] == 1 and len(list(store.disk.dir.iterdir())) == 1
    prefix, _ = await _loaded(await store.find("a", _content(longer)))
    assert prefix.token_ids == longer


async def test_a_turn_without_a_session_is_not_kept(tmp_path, channel):
    store = _store(tmp_path, channel)
    await store.keep(None, exported(channel, TURN), _content(TURN))
    assert store.stats()["prefixes"] == 0


async def test_turns_that_find_and_keep_at_once_leave_a_consistent_store(tmp_path, channel):
    """Loads from disk run off the event loop while other sessions keep and find."""
    store = _store(tmp_path, channel, host_prefixes=1.5)
    prompts = {f"s{i}": [*range(100 * i, 100 * i + 96)] for i in range(6)}
    for sid, tokens in prompts.items():
        await store.keep(sid, exported(channel, tokens, seed=len(sid)), _content(tokens))
    found = await asyncio.gather(
        *(store.find(sid, _content(tokens)) for sid, tokens in prompts.items()),
        *(
            store.keep(sid, exported(channel, [*tokens, *range(8)]), _content([*tokens, *range(8)]))
            for sid, tokens in list(prompts.items())[:3]
        ),
    )
    handed = [KVPrefix.decode(f) for f in found[:6] if f is not None]
    assert len(handed) == 6
    assert all(p.token_ids[:96] == prompts[f"s{i}"] for i, p in enumerate(handed))
    store.disk.flush()
    stats = store.stats()
    assert stats["prefixes"] == 6 and stats["host"]["bytes"] <= stats["host"]["max_bytes"]
    assert stats["host"]["prefixes"] + stats["disk"]["prefixes"] >= 6


async def test_a_kept_prefix_gives_the_exporters_shared_memory_back_at_once(tmp_path):
    """The store copies what it keeps: the Thinker's transport pool is not held by the
    store's budget, even while the prefix waits in memory or for its disk write."""
    exporter = SharedMemoryChannel()
    encoded = exported(exporter, TURN)
    ref = KVPrefix.decode(encoded).ref
    store = _store(tmp_path, exporter)
    await store.keep("s", encoded, _content(TURN))
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    assert generation != ref.handle[1] or state == shm.FREE
    assert store.stats()["host"]["bytes"] == ONE  # kept all the same


async def test_a_store_that_stops_spills_its_memory_for_the_next_one(tmp_path, channel):
    store = _store(tmp_path, channel)  # memory holds both: nothing on disk yet
    await store.keep("a", exported(channel, TURN, seed=3), _content(TURN))
    await store.keep("b", exported(channel, TURN, seed=4), _content(TURN, media=()))
    assert store.spill(timeout_s=0) == 0  # spill_on_stop_s: 0, no spill
    assert store.stats()["disk"]["prefixes"] == 0
    assert store.spill(timeout_s=10) == 2
    assert store.spill(timeout_s=10) == 0  # on disk already: not written twice
    restarted = _store(tmp_path, channel)
    _, blocks = await _loaded(await restarted.find("a", _content(TURN)))
    for name, t in kv_blocks(len(TURN), 3).items():
        assert torch.equal(blocks[name], t)
    assert restarted.stats()["disk"]["hits"] == 1


async def test_sessions_with_the_same_system_prompt_hold_its_blocks_once(tmp_path, channel):
    """A voice agent's callers: memory holds the shared system prompt's KV once, and each
    caller's next turn still gets its own whole prefix."""
    store = _store(tmp_path, channel)
    other = [*SYSTEM, *range(40, 72)]
    ours, theirs = kv_blocks(len(TURN), 3), kv_blocks(len(other), 4)
    shared = len(SYSTEM) // BLOCK
    for name in theirs:  # the same system prompt (and image) computes the same KV
        theirs[name][:shared] = ours[name][:shared]
    for session, tokens, kv in (("a", TURN, ours), ("b", other, theirs)):
        ref = channel.put({name: t.clone() for name, t in kv.items()})
        encoded = KVPrefix(tokens, BLOCK, ref, ["img"], "NHD", mm_offsets=[1]).encode()
        await store.keep(session, encoded, _content(tokens))
    host = store.stats()["host"]
    block_bytes = sum(t[0].numel() * 4 for t in ours.values())
    assert host["prefix_bytes"] == 2 * ONE
    assert host["bytes"] == 2 * ONE - shared * block_bytes
    assert host["blocks"] == len(TURN) // BLOCK + len(other) // BLOCK - shared
    for session, tokens, kv in (("a", TURN, ours), ("b", other, theirs)):
        _, blocks = await _loaded(await store.find(session, _content(tokens)))
        for name, t in kv.items():
            assert torch.equal(blocks[name], t)


async def test_an_export_whose_blocks_do_not_match_its_tokens_is_not_kept(tmp_path, channel):
    store = _store(tmp_path, channel)
    ref = channel.put(kv_blocks(len(TURN) - BLOCK, 0))  # one block short of its token ids
    await store.keep("a", KVPrefix(TURN, BLOCK, ref, ["img"], "NHD", mm_offsets=[1]).encode(), None)
    assert store.stats()["prefixes"] == 0 and await store.find("a", _content(TURN)) is None
