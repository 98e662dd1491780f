"""The chat's part of the session KV handover: a session's turn hands the Thinker a copy of
the prefix its last turn exported (through whichever chat replica it came) and keeps the one
this turn exports in the app's session store; a turn that fails frees the copy it was handed
(the store keeps the prefix); requests without a session keep nothing; a store that fails or
hangs costs the turn its prefix only."""

from __future__ import annotations

import asyncio

import pytest
import torch

from deployments import session_store
from deployments.omni_chat import OmniChat
from deployments.session_store import SessionStore, SessionStoreClient
from omni_serve.config.kv_store import KVStoreConfig
from omni_serve.kv_store.tiered_store import TieredPrefixStore
from omni_serve.models.thinker_talker.chat_flow import ChatOptions, collect
from omni_serve.models.thinker_talker.messages import ThinkerChunk, ThinkerRequest
from omni_serve.models.thinker_talker.request import PreparedPrompt
from omni_serve.observability.metrics import ApiMetrics
from omni_serve.testing.local_handle import LocalHandle
from omni_serve.transport import SharedMemoryChannel
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.session_prefixes import free_prefix


class FakeThinker:
    """Stage clients whose Thinker answers one token and exports a fresh prefix per turn."""

    def __init__(self, fail: bool = False) -> None:
        self.channel = SharedMemoryChannel()
        self.requests: list[ThinkerRequest] = []
        self.exported: list[str] = []
        self.fail = fail

    async def thinker(self, request: ThinkerRequest):
        self.requests.append(request)
        if self.fail:
            raise RuntimeError("thinker replica died")
        ref = self.channel.put({"layer.0": torch.ones(2, 4)})
        self.exported.append(KVPrefix(request.prompt_ids, 2, ref).encode())
        yield ThinkerChunk(
            [5],
            "hi",
            True,
            "stop",
            num_prompt_tokens=len(request.prompt_ids),
            num_cached_tokens=2,
            session_kv=self.exported[-1] if request.session_id else None,
        )


@pytest.fixture
def clients():
    """The fake Thinker; afterwards every prefix it exported is freed (a double free is a
    no-op), so no segment stays in use for tests that count them later in this process."""
    fake = FakeThinker()
    yield fake
    for encoded in fake.exported:
        free_prefix(encoded)


def _store():
    config = KVStoreConfig(disk_path=None)
    tiers = TieredPrefixStore(config, "ns", SharedMemoryChannel())
    return SessionStore.func_or_class(None, store=tiers)


def _kept(chat) -> int:
    return chat.store.store.stats()["prefixes"]


def _handed(request: ThinkerRequest) -> list[int]:
    return KVPrefix.decode(request.session_kv).token_ids


def _chat(clients: FakeThinker, store=None) -> OmniChat:
    """The chat path of a text pipeline over ``clients``, its session store ``store``
    (a fresh one by default) kept on it as ``chat.store`` for the test to look into."""
    store = store if store is not None else _store()
    chat = OmniChat(
        None,
        None,
        clients,
        ApiMetrics(),
        voices=set(),
        speaks=False,
        context_tokens=4096,
        media_limits={},
        sessions=SessionStoreClient(LocalHandle(store)),
    )
    chat.store = store
    return chat


def _freed(encoded: str) -> bool:
    ref = KVPrefix.decode(encoded).ref
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    return generation != ref.handle[1] or state == shm.FREE


def _turn(chat, session: str | None, request_id: str):
    prompt = PreparedPrompt(prompt_ids=[1, 2, 3, 4], multi_modal_data={})
    options = ChatOptions({"max_tokens": 1}, session_id=session)
    return collect(chat.events(prompt, options, request_id))


async def test_a_turn_gets_the_prefix_its_last_turn_exported(clients):
    chat = _chat(clients)
    first = await _turn(chat, "s", "t1")
    assert clients.requests[0].session_kv is None and first.cached_tokens == 2
    assert _kept(chat) == 1
    await _turn(chat, "s", "t2")
    assert _handed(clients.requests[1]) == [1, 2, 3, 4]  # a copy, handed to the Thinker
    assert _kept(chat) == 1  # turn two's replaced turn one's
    counted = chat.metrics.registry.get_sample_value
    assert counted("omni_prompt_tokens_total", {"kind": "cached"}) == 4  # 2 per turn
    assert counted("omni_prompt_tokens_total", {"kind": "computed"}) == 4


async def test_a_failed_turn_frees_the_prefix_it_was_handed(clients):
    chat = _chat(clients)
    await _turn(chat, "s", "t1")
    clients.fail = True
    with pytest.raises(RuntimeError, match="died"):
        await _turn(chat, "s", "t2")
    assert _freed(clients.requests[1].session_kv)  # the copy it was handed
    assert _kept(chat) == 1  # the prefix itself is still there for the retry


async def test_requests_without_a_session_keep_nothing(clients):
    chat = _chat(clients)
    await _turn(chat, None, "t1")
    assert clients.requests[0].session_kv is None and _kept(chat) == 0


async def test_a_turn_through_another_ingress_replica_gets_the_prefix(clients):
    """Serve's proxy sent turn two to the other chat replica: the store is the app's."""
    store = _store()
    first, second = _chat(clients, store), _chat(clients, store)
    await _turn(first, "s", "t1")
    await _turn(second, "s", "t2")
    assert _handed(clients.requests[1]) == [1, 2, 3, 4]
    stats = await second.sessions.stats()
    assert stats["prefixes"] == 1 and stats["host"]["bytes"] == 2 * 4 * 4


class FailingStore:
    async def find(self, session_id, content):
        raise RuntimeError("store replica died")

    async def keep(self, session_id, encoded, content):
        raise RuntimeError("store replica died")

    async def stats(self):
        await asyncio.sleep(60)  # hangs (being replaced)


async def test_a_failing_store_costs_the_turn_its_prefix_only(clients, monkeypatch):
    monkeypatch.setattr(session_store, "STORE_TIMEOUT_S", 0.1)
    chat = _chat(clients, FailingStore())
    result = await _turn(chat, "s", "t1")
    assert result.token_ids == [5] and clients.requests[0].session_kv is None
    assert _freed(clients.exported[0])  # it could not be kept: nobody would free it
    assert await chat.sessions.stats() is None  # /metrics shows the store's last numbers
