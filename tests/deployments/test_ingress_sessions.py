"""The ingress's part of the session KV handover: a session's turn hands the Thinker the prefix
its last turn exported and keeps the one this turn exports; a turn that fails frees the prefix
it was handed; requests without a session keep nothing."""

from __future__ import annotations

import pytest
import torch

from deployments.ingress import Ingress
from omni_serve.api.metrics import ApiMetrics
from omni_serve.models.qwen3_omni.pipeline import ChatOptions, collect
from omni_serve.models.qwen3_omni.request import PreparedPrompt
from omni_serve.transport import SharedMemoryChannel
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.session_prefixes import SessionPrefixes


class FakeThinker:
    """Stage clients whose Thinker answers one token and exports a fresh prefix per turn."""

    def __init__(self, fail: bool = False) -> None:
        self.channel = SharedMemoryChannel()
        self.requests: list[dict] = []
        self.exported: list[str] = []
        self.fail = fail

    async def thinker(self, request):
        self.requests.append(request)
        if self.fail:
            raise RuntimeError("thinker replica died")
        ref = self.channel.put({"layer.0": torch.ones(2, 4)})
        self.exported.append(KVPrefix(request["prompt_ids"], 2, ref).encode())
        yield {"token_ids": [5], "text": "hi", "finished": True, "finish_reason": "stop",
               "num_prompt_tokens": len(request["prompt_ids"]), "num_cached_tokens": 2,
               "session_kv": self.exported[-1] if request.get("session_id") else None}  # fmt: skip


def _ingress(clients: FakeThinker):
    ingress = object.__new__(Ingress.func_or_class)
    ingress.clients, ingress.sessions, ingress.metrics = clients, SessionPrefixes(), ApiMetrics()
    return ingress


def _freed(encoded: str) -> bool:
    ref = KVPrefix.decode(encoded).ref
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    return generation != ref.handle[1] or state == shm.FREE


def _turn(ingress, session: str | None, request_id: str):
    prompt = PreparedPrompt(prompt_ids=[1, 2, 3, 4], multi_modal_data={})
    options = ChatOptions({"max_tokens": 1}, session_id=session)
    return collect(ingress._chat(prompt, options, request_id))


async def test_a_turn_gets_the_prefix_its_last_turn_exported():
    clients = FakeThinker()
    ingress = _ingress(clients)
    first = await _turn(ingress, "s", "t1")
    assert clients.requests[0]["session_kv"] is None and first.cached_tokens == 2
    assert len(ingress.sessions) == 1
    await _turn(ingress, "s", "t2")
    assert clients.requests[1]["session_kv"] == clients.exported[0]  # handed to the Thinker
    assert len(ingress.sessions) == 1 and ingress.sessions.pop("s") == clients.exported[1]
    counted = ingress.metrics.registry.get_sample_value
    assert counted("omni_prompt_tokens_total", {"kind": "cached"}) == 4  # 2 per turn
    assert counted("omni_prompt_tokens_total", {"kind": "computed"}) == 4


async def test_a_failed_turn_frees_the_prefix_it_was_handed():
    clients = FakeThinker()
    ingress = _ingress(clients)
    await _turn(ingress, "s", "t1")
    clients.fail = True
    with pytest.raises(RuntimeError, match="died"):
        await _turn(ingress, "s", "t2")
    assert _freed(clients.exported[0]) and len(ingress.sessions) == 0


async def test_requests_without_a_session_keep_nothing():
    clients = FakeThinker()
    ingress = _ingress(clients)
    await _turn(ingress, None, "t1")
    assert clients.requests[0]["session_kv"] is None and len(ingress.sessions) == 0
