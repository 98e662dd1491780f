"""User story: with three replicas of a stage behind the affinity router, every turn of a
conversation reaches the same replica (where its prefix cache is), conversations spread over
the replicas, and the least-loaded router sends work to an idle replica rather than a busy one.

The routers run inside Serve for real (DeploymentHandle calls on a local Ray instance); the
deployment only reports which replica answered, so the test sees the routing and nothing else.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from omni_serve.config import DeploymentSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def serve_instance():
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="routing-test")
    serve.start(proxy_location="Disabled")
    yield serve
    serve.shutdown()
    ray.shutdown()


def deploy(serve, name: str, router: str):
    @serve.deployment
    class WhoAnswers:
        async def __call__(self, request: dict) -> str:
            await asyncio.sleep(request.get("work_s", 0))
            return serve.get_replica_context().replica_id.unique_id

    options = DeploymentSettings(num_replicas=3, request_router=router).serve_options()
    options.pop("ray_actor_options")
    app = WhoAnswers.options(ray_actor_options={"num_cpus": 0}, **options).bind()
    return serve.run(app, name=name, route_prefix=None)


def test_a_conversation_keeps_its_replica_and_conversations_spread(serve_instance):
    handle = deploy(serve_instance, "affinity", "affinity")
    system = list(range(1000, 1070))

    def turns(conversation: int) -> list[dict]:
        opening = [conversation] + system
        return [{"prompt_ids": opening + list(range(n))} for n in (1, 5, 9, 13)]

    owners = {}
    for conversation in range(12):
        answered = {handle.remote(turn).result() for turn in turns(conversation)}
        assert len(answered) == 1, f"conversation {conversation} moved: {answered}"
        owners[conversation] = answered.pop()
    assert len(set(owners.values())) >= 2  # not everything on one replica
    by_session = {
        handle.remote({"session_id": "s-7", "prompt_ids": [n]}).result() for n in range(6)
    }
    assert len(by_session) == 1
    # OpenAI's prompt_cache_key (the Thinker request's cache_key) holds short prompts together
    by_key = {
        k: {handle.remote({"cache_key": k, "prompt_ids": [n]}).result() for n in range(3)}
        for k in (f"tenant-{i}" for i in range(10))
    }
    assert all(len(replicas) == 1 for replicas in by_key.values()), by_key
    assert len(set.union(*by_key.values())) >= 2  # one replica for all ten: 3 / 3**10 odds


def test_least_loaded_sends_quick_work_to_the_idle_replica(serve_instance):
    """Two of three replicas are busy: power of two choices would pick two busy ones a third
    of the time; least-loaded probes all three and picks the idle one (a probe that times out
    on this loaded 2-core machine can still cost one request its best choice)."""
    handle = deploy(serve_instance, "least-loaded", "least_loaded")
    busy = []
    for _ in range(2):
        busy.append(handle.remote({"work_s": 6}))
        time.sleep(0.5)
    quick = []
    for _ in range(12):  # spaced: Serve decrements its queue-length cache in a done callback
        quick.append(handle.remote({}).result())
        time.sleep(0.1)
    slow = {r.result() for r in busy}
    on_busy = [q for q in quick if q in slow]
    assert len(on_busy) <= 1, (quick, slow)
