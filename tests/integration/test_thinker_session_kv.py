"""User story: a conversation's next turn lands on another Thinker replica, which loads the KV
its previous turn computed on the first replica instead of prefilling it again, and answers the
same; on the replica that holds the prefix already, the handed-over copy is just freed."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.thinker import ThinkerDeployment
from omni_serve.config.loading import load_pipeline_config
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import EXPORT_KEY, PREFIX_KEY, KVPrefix

pytestmark = pytest.mark.integration
BLOCK = 128  # vLLM's CPU block size
TURN_ONE = [(i * 7919) % 250 + 10 for i in range(300)]
TURN_TWO = [*TURN_ONE, 42, 43, 44, 45, 46]
CONFIG = Path(__file__).parents[2] / "configs/pipelines/qwen3_omni_tiny.yaml"


async def _new_replica(pipeline: dict) -> ThinkerDeployment:
    cls = ThinkerDeployment.func_or_class
    replica = object.__new__(cls)
    await cls.__init__(replica, pipeline)
    return replica


@pytest.fixture(scope="module")
async def replicas(tiny_omni_path):
    pipeline = load_pipeline_config(CONFIG).model_dump()
    pipeline["model"] = str(tiny_omni_path)
    for edge in pipeline["edges"]:
        if edge["payload"] == "session_kv":  # the tiny model's blocks would ride inline
            edge["channel"]["backend"] = "shared_memory"
    first, second = await _new_replica(pipeline), await _new_replica(pipeline)
    yield first, second
    for replica in (first, second):
        replica._watchdog.cancel()  # else it exits this process when the engine stops
        await replica.engine.shutdown()


async def _turn(replica, request_id: str, prompt: list[int], session_kv: str | None = None):
    request = {
        "request_id": request_id, "prompt_ids": prompt, "session_id": "s-1",
        "session_kv": session_kv, "sampling": {"max_tokens": 4, "temperature": 0.0},
    }  # fmt: skip
    chunks = [chunk async for chunk in replica.generate(request)]
    tokens = [t for c in chunks for t in c["token_ids"]]
    return tokens, chunks[0]["num_cached_tokens"], chunks[-1].get("session_kv")


def _freed(encoded: str) -> bool:
    ref = KVPrefix.decode(encoded).ref
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    return generation != ref.handle[1] or state == shm.FREE


async def test_the_next_turn_on_another_replica_loads_the_prefix(replicas):
    first, second = replicas
    _, cached, exported = await _turn(first, "t1", TURN_ONE)
    assert cached == 0 and exported
    tokens, cached, _ = await _turn(second, "t2-elsewhere", TURN_TWO, exported)
    assert cached == len(TURN_ONE) // BLOCK * BLOCK  # second never saw this conversation
    assert _freed(exported)  # taken once
    reference, _, _ = await _turn(first, "t2-reference", TURN_TWO)  # first computed turn one
    assert tokens == reference


async def test_the_replica_holding_the_prefix_frees_the_copy(replicas):
    first, _ = replicas
    prompt = [(i * 31) % 250 + 10 for i in range(300)]
    _, _, exported = await _turn(first, "same-1", prompt)
    assert exported and not _freed(exported)
    _, cached, _ = await _turn(first, "same-2", [*prompt, 7, 8], exported)
    assert cached == len(prompt) // BLOCK * BLOCK  # from its own prefix cache
    assert _freed(exported)  # not left to wait for the lease


def test_a_turn_that_captures_rows_loads_nothing(replicas):
    first, _ = replicas
    params = first._kv_params({"session_id": "s-1", "session_kv": None}, capturing=True)
    assert params == {EXPORT_KEY: True}  # exports for the next turn, loads nothing
    assert first._kv_params({"session_kv": None}, capturing=False) is None  # no session
    assert PREFIX_KEY not in (params or {})
