"""A session's kept KV prefix: handed out once, and every prefix nobody will load is freed
(replaced, evicted, expired, or without a session), so kept sessions hold no stale buffers."""

from __future__ import annotations

import pytest
import torch

from omni_serve.transport import ChannelError, SharedMemoryChannel, take
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.session_prefixes import SessionPrefixes, free_prefix


def _prefix(channel, value: float) -> str:
    ref = channel.put({"layer.0": torch.full((2, 4), value)})
    return KVPrefix(list(range(8)), 4, ref).encode()


def _state(encoded: str) -> int:
    ref = KVPrefix.decode(encoded).ref
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    return state if generation == ref.handle[1] else shm.FREE


@pytest.fixture
def channel():
    return SharedMemoryChannel()


async def test_a_kept_prefix_is_handed_out_once_and_loads(channel):
    sessions = SessionPrefixes()
    encoded = _prefix(channel, 3.0)
    sessions.keep("s", encoded)
    assert sessions.pop("s") == encoded and sessions.pop("s") is None
    blocks = await take(KVPrefix.decode(encoded).ref)
    assert torch.equal(blocks["layer.0"], torch.full((2, 4), 3.0))


def test_the_next_turn_replaces_and_frees_the_last(channel):
    sessions = SessionPrefixes()
    first, second = _prefix(channel, 1.0), _prefix(channel, 2.0)
    sessions.keep("s", first)
    sessions.keep("s", second)
    assert _state(first) == shm.FREE and _state(second) == shm.IN_USE
    sessions.keep("s", None)  # a turn that exported nothing: nothing stale kept either
    assert _state(second) == shm.FREE and len(sessions) == 0


def test_the_least_recently_kept_session_is_evicted_past_the_bound(channel):
    sessions = SessionPrefixes(max_sessions=2)
    a, b, c = (_prefix(channel, float(i)) for i in range(3))
    sessions.keep("a", a)
    sessions.keep("b", b)
    sessions.keep("c", c)
    assert len(sessions) == 2 and sessions.pop("a") is None
    assert _state(a) == shm.FREE and _state(b) == shm.IN_USE and _state(c) == shm.IN_USE
    sessions.clear()
    assert _state(b) == shm.FREE and _state(c) == shm.FREE


def test_the_store_keeps_at_most_its_byte_budget(channel):
    sessions = SessionPrefixes(max_bytes=64)  # each prefix: 2 x 4 float32 = 32 bytes
    a, b, c = (_prefix(channel, float(i)) for i in range(3))
    for session, encoded in zip("abc", (a, b, c), strict=True):
        sessions.keep(session, encoded)
    assert sessions.nbytes == 64 and _state(a) == shm.FREE and sessions.pop("a") is None
    assert sessions.pop("b") == b and sessions.nbytes == 32
    too_big = SessionPrefixes(max_bytes=16)
    too_big.keep("s", c)
    assert len(too_big) == 0 and too_big.nbytes == 0 and _state(c) == shm.FREE


def test_an_expired_prefix_is_freed_not_handed_out(channel):
    sessions = SessionPrefixes(ttl_s=-1.0)
    encoded = _prefix(channel, 1.0)
    sessions.keep("s", encoded)
    assert sessions.pop("s") is None and _state(encoded) == shm.FREE


def test_without_a_session_nobody_could_ask_for_it(channel):
    encoded = _prefix(channel, 1.0)
    SessionPrefixes().keep(None, encoded)
    assert _state(encoded) == shm.FREE


async def test_freeing_a_prefix_already_loaded_is_harmless(channel):
    encoded = _prefix(channel, 1.0)
    await take(KVPrefix.decode(encoded).ref)
    again = _prefix(channel, 2.0)  # the pool may hand the same segment out again
    free_prefix(encoded)
    assert torch.equal((await take(KVPrefix.decode(again).ref))["layer.0"], torch.full((2, 4), 2.0))
    with pytest.raises(ChannelError):
        await take(KVPrefix.decode(encoded).ref)
    free_prefix("not a prefix")  # unreadable: logged, not raised


def test_a_prefixs_companion_counts_toward_the_budget_and_goes_with_it(channel):
    """The Thinker's rows kept with a spoken turn's prefix are part of what the store holds."""
    prefix = KVPrefix.decode(_prefix(channel, 1.0))
    prefix.companion = channel.put(torch.zeros(4))  # 16 bytes beside the 32 of the blocks
    encoded = prefix.encode()
    companion = KVPrefix(list(range(8)), 4, prefix.companion).encode()  # its state, readable
    sessions = SessionPrefixes(max_bytes=64)
    sessions.keep("s", encoded)
    assert sessions.nbytes == 48 and _state(companion) == shm.IN_USE
    sessions.keep("t", _prefix(channel, 2.0))  # 80 bytes > 64: the oldest, both refs, goes
    assert sessions.nbytes == 32
    assert _state(encoded) == shm.FREE and _state(companion) == shm.FREE
    free_prefix(sessions.pop("t"))
