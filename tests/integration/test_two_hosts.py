"""User story: an operator runs stages on two hosts. Tensors between them take a backend that
crosses hosts without being told (the default channel sees the cluster spans hosts), a
conversation's next turn on a Thinker replica of the other host loads the KV its first turn
exported there, and an edge pinned to shared memory fails with an error naming both hosts.

The second host is a Ray node in namespaces of its own on this machine (network behind a veth
pair, hostname, /dev/shm, IPC, PIDs: ``omni_serve.testing.two_hosts``), so nothing crosses but
over the network, as between two machines."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from omni_serve.config.loading import load_pipeline_config
from omni_serve.testing.two_hosts import TwoHosts
from omni_serve.transport.kv_blocks import KVPrefix
from tests.integration.two_hosts_ray import ray_on

pytestmark = pytest.mark.integration
CONFIG = Path(__file__).parents[2] / "configs/pipelines/qwen3_omni_tiny.yaml"
BLOCK = 128  # vLLM's CPU block size
TURN_ONE = [(i * 7919) % 250 + 10 for i in range(300)]
TURN_TWO = [*TURN_ONE, 42, 43, 44, 45, 46]


@pytest.fixture(scope="module")
def ray_on_two_hosts():
    yield from ray_on(TwoHosts())


def pinned(host: str) -> dict:
    return {"num_cpus": 0, "resources": {host: 0.01}}


def payload(nbytes: int) -> dict[str, torch.Tensor]:
    return {
        "rows": torch.arange(nbytes // 4, dtype=torch.float32),
        "mask": torch.ones(16, dtype=torch.bool),
    }


@pytest.fixture(scope="module")
def stage_classes(ray_on_two_hosts):
    ray = ray_on_two_hosts

    @ray.remote
    class Producer:
        def put(self, backend: str, nbytes: int):
            import socket

            from omni_serve.transport import make_channel

            return socket.gethostname(), make_channel(backend).put(payload(nbytes))

        def segments_in_use(self) -> int:
            from omni_serve.transport import shared_memory

            pool = shared_memory._pool.segments.values()
            return sum(segment.state()[1] != shared_memory.FREE for segment in pool)

    @ray.remote
    class Consumer:
        async def take(self, ref, mapped: bool = False):
            """Also, with ``mapped``: whether the payload's segment was mapped here."""
            import socket

            from omni_serve.transport import ChannelError, take

            try:
                got = await take(ref)
            except ChannelError as exc:
                return socket.gethostname(), str(exc)
            if mapped:  # asked while the tensors still view it
                return socket.gethostname(), got, ref.key in Path("/proc/self/maps").read_text()
            return socket.gethostname(), got

    return Producer, Consumer


@pytest.fixture(scope="module")
def producer_and_consumer(stage_classes):
    producer, consumer = stage_classes
    return (
        producer.options(**pinned("host_a")).remote(),
        consumer.options(**pinned("host_b")).remote(),
    )


@pytest.fixture(scope="module")
def consumer_beside_the_producer(stage_classes):
    return stage_classes[1].options(**pinned("host_a")).remote()


@pytest.mark.parametrize(
    ("backend", "nbytes", "used"),
    [
        ("auto", 4 << 20, "shared_memory_direct"),
        ("auto", 4 << 10, "inline"),
        ("object_store", 4 << 20, "object_store"),
        ("direct", 4 << 20, "direct"),
    ],
)
def test_a_payload_crosses_hosts(ray_on_two_hosts, producer_and_consumer, backend, nbytes, used):
    ray = ray_on_two_hosts
    producer, consumer = producer_and_consumer
    made_on, ref = ray.get(producer.put.remote(backend, nbytes))
    read_on, got = ray.get(consumer.take.remote(ref))
    assert (made_on, read_on) == (socket.gethostname(), TwoHosts.hostname)
    assert ref.backend == used
    expected = payload(nbytes)
    assert torch.equal(got["rows"], expected["rows"]) and torch.equal(got["mask"], expected["mask"])


def test_one_put_is_mapped_beside_the_producer_and_read_over_the_network_elsewhere(
    ray_on_two_hosts, producer_and_consumer, consumer_beside_the_producer
):
    """Where a handle call will be routed is not known at the put: with ``auto`` a stage on
    the producer's host maps the payload (no second copy), one on the other host reads it over
    NIXL, and both hand their segment back."""
    import time

    ray = ray_on_two_hosts
    producer, elsewhere = producer_and_consumer
    refs = [ray.get(producer.put.remote("auto", 4 << 20))[1] for _ in range(2)]
    assert {ref.backend for ref in refs} == {"shared_memory_direct"}
    results = ray.get(
        [
            consumer_beside_the_producer.take.remote(refs[0], mapped=True),
            elsewhere.take.remote(refs[1], mapped=True),
        ]
    )
    assert [(host, mapped) for host, _, mapped in results] == [
        (socket.gethostname(), True),
        (TwoHosts.hostname, False),
    ]
    for _, got, _ in results:
        assert torch.equal(got["rows"], payload(4 << 20)["rows"])
    deadline = time.monotonic() + 10
    while (in_use := ray.get(producer.segments_in_use.remote())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_use == 0, "a consumer's segment never came back to the producer's pool"


def test_a_shared_memory_ref_read_on_another_host_fails_naming_both(
    ray_on_two_hosts, producer_and_consumer
):
    ray = ray_on_two_hosts
    producer, consumer = producer_and_consumer
    made_on, ref = ray.get(producer.put.remote("shared_memory", 4 << 20))
    read_on, error = ray.get(consumer.take.remote(ref))
    assert isinstance(error, str), "another host cannot map this host's shared memory"
    assert f"lives on host {ref.handle[0]}, read on {read_on}#" in error
    assert ref.handle[0].startswith(f"{made_on}#") and "object_store" in error


@pytest.fixture
def serve_on_two_hosts(ray_on_two_hosts):
    from ray import serve

    serve.start(proxy_location="Disabled")
    yield serve
    serve.shutdown()


def test_a_stage_on_both_hosts_is_called_on_the_callers_host(serve_on_two_hosts):
    """least_loaded ranks the replica beside the caller first while queues are even, so the
    payload is mapped there rather than read over the network (the config's router; with
    ``local_slack: -1`` calls left the caller's host, checked)."""
    import ray

    from omni_serve.config import DeploymentSettings

    serve = serve_on_two_hosts
    router = DeploymentSettings(num_replicas=2, request_router="least_loaded").serve_options()
    router.pop("ray_actor_options")

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_replicas_per_node=1, **router)
    class Reader:
        async def __call__(self, ref) -> tuple[str, bool]:
            from omni_serve.transport import take

            got = await take(ref)
            assert torch.equal(got["rows"], payload(4 << 20)["rows"])
            mapped = ref.key in Path("/proc/self/maps").read_text()
            return ray.get_runtime_context().get_node_id(), mapped

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Writer:
        def __init__(self, reader) -> None:
            from omni_serve.transport import make_channel

            self.reader, self.channel = reader, make_channel()

        async def __call__(self, calls: int) -> tuple[str, list[tuple[str, bool]]]:
            answers = [
                await self.reader.remote(self.channel.put(payload(4 << 20))) for _ in range(calls)
            ]
            return ray.get_runtime_context().get_node_id(), answers

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class BothHosts:
        def __init__(self, *writers) -> None:
            self.writers = writers

        async def __call__(self, calls: int):
            return [await writer.remote(calls) for writer in self.writers]

    reader = Reader.bind()
    writers = [
        Writer.options(name=f"writer_{host}", ray_actor_options=pinned(host)).bind(reader)
        for host in ("host_a", "host_b")
    ]
    handle = serve.run(BothHosts.bind(*writers), name="locality", route_prefix=None)
    results = handle.remote(8).result(timeout_s=120)
    assert len({node for node, _ in results}) == 2  # a writer on each host
    for node, answers in results:
        assert answers == [(node, True)] * 8, "a call left the caller's host"


@pytest.fixture(scope="module")
def thinkers(ray_on_two_hosts, tiny_omni_path):
    """A Thinker replica on each host, built as Serve builds one, with the tiny pipeline's
    session edge as it ships (the default channel), each engine on a core of its own."""
    ray = ray_on_two_hosts

    @ray.remote
    class Thinker:
        async def start(self, pipeline: dict) -> None:
            from deployments.thinker import ThinkerDeployment

            cls = ThinkerDeployment.func_or_class
            self.replica = object.__new__(cls)
            await cls.__init__(self.replica, pipeline)

        async def turn(self, request_id: str, prompt: list[int], session_kv: str | None = None):
            from omni_serve.engines.ar.base import SamplingConfig
            from omni_serve.models.thinker_talker.messages import ThinkerRequest, from_wire

            greedy = SamplingConfig(max_tokens=4, temperature=0.0)
            request = ThinkerRequest(
                request_id, prompt, greedy, session_id="s-hosts", session_kv=session_kv
            )
            chunks = [from_wire(c) async for c in self.replica.generate(request)]
            tokens = [t for c in chunks for t in c.token_ids]
            return tokens, chunks[0].num_cached_tokens, chunks[-1].session_kv

        async def stop(self) -> None:
            self.replica._watchdog.cancel()  # else it exits the actor when the engine stops
            await self.replica.engine.shutdown()

    replicas, started = [], []
    for host, core in (("host_a", 0), ("host_b", 1)):
        pipeline = load_pipeline_config(CONFIG).model_dump()
        pipeline["model"] = str(tiny_omni_path)
        [stage] = [s for s in pipeline["stages"] if s["name"] == "thinker"]
        stage["deployment"]["cpu_cores"] = [core]
        replicas.append(Thinker.options(**pinned(host)).remote())
        started.append(replicas[-1].start.remote(pipeline))
    ray.get(started)
    yield replicas
    ray.get([replica.stop.remote() for replica in replicas])


def test_the_next_turn_on_the_other_hosts_thinker_loads_the_prefix(ray_on_two_hosts, thinkers):
    """The export is made in vLLM's engine process, which cannot see the cluster: the Thinker
    names the backend for it (shared memory lent to NIXL while the cluster spans hosts)."""
    ray = ray_on_two_hosts
    here, there = thinkers
    _, cached, exported = ray.get(here.turn.remote("t1", TURN_ONE))
    assert cached == 0 and exported
    assert KVPrefix.decode(exported).ref.backend == "shared_memory_direct"
    tokens, cached, _ = ray.get(there.turn.remote("t2-elsewhere", TURN_TWO, exported))
    assert cached == len(TURN_ONE) // BLOCK * BLOCK  # loaded over the network, not computed
    reference, _, _ = ray.get(here.turn.remote("t2-reference", TURN_TWO))
    assert tokens == reference
