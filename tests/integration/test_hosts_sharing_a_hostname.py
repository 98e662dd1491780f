"""User story: an operator runs Ray nodes in containers on the host's network (they share its
hostname, each has a /dev/shm of its own). Tensors between stages on two of them still arrive:
the default channel sees two hosts, not one, and an edge pinned to shared memory fails with an
error naming both hosts instead of "freed".

The second node is a Ray node in namespaces of its own on this machine
(``omni_serve.testing.two_hosts``) given this machine's hostname."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from omni_serve.testing.two_hosts import TwoHosts
from tests.integration.two_hosts_ray import ray_on

pytestmark = pytest.mark.integration
NBYTES = 4 << 20


@pytest.fixture(scope="module")
def ray_on_twins():
    twin = TwoHosts(
        namespace="omni-twin",
        hostname=socket.gethostname(),
        head_ip="10.212.0.1",
        other_ip="10.212.0.2",
        shm_size="1g",
    )
    yield from ray_on(twin)


@pytest.fixture(scope="module")
def producer_and_consumer(ray_on_twins):
    ray = ray_on_twins

    @ray.remote(num_cpus=0)
    class Stage:
        def __init__(self) -> None:
            from omni_serve.transport import make_channel

            self.channel = make_channel()  # a stage makes its edges' channels when it starts

        def put(self, backend: str):
            from omni_serve.transport import hosts, make_channel

            payload = torch.arange(NBYTES // 4, dtype=torch.float32)
            return hosts.cluster_is_one_host(), make_channel(backend).put(payload)

        def settle(self, seconds: float) -> tuple[bool | None, bool | None]:
            """The first locality check, and the first one that knows (or the last tried)."""
            from omni_serve.transport import hosts

            verdicts = [hosts.cluster_is_one_host()]
            deadline = time.monotonic() + seconds
            while verdicts[-1] is None and time.monotonic() < deadline:
                time.sleep(0.2)
                verdicts.append(hosts.cluster_is_one_host())
            return verdicts[0], verdicts[-1]

        async def take(self, ref):
            from omni_serve.transport import ChannelError, take

            try:
                return socket.gethostname(), await take(ref)
            except ChannelError as exc:
                return socket.gethostname(), str(exc)

    consumer = Stage.options(resources={"host_b": 0.01}).remote()
    ray.get(consumer.__ray_ready__.remote())  # started (and announced) before the first put
    return Stage.options(resources={"host_a": 0.01}).remote(), consumer


def _send(ray, producer_and_consumer, backend: str):
    """A 4 MB payload put on host a with ``backend``, taken on host b: whether the producer
    saw one host, the ref, the consumer's hostname, and what it got (or its error)."""
    producer, consumer = producer_and_consumer
    one_host, ref = ray.get(producer.put.remote(backend))
    return (one_host, ref, *ray.get(consumer.take.remote(ref)))


def test_auto_sends_across_nodes_that_share_a_hostname_but_not_shared_memory(
    ray_on_twins, producer_and_consumer
):
    one_host, ref, hostname, got = _send(ray_on_twins, producer_and_consumer, "auto")
    assert hostname == socket.gethostname() and not one_host
    assert ref.backend == "shared_memory_direct"  # NIXL is installed (the [direct] extra)
    assert torch.equal(got, torch.arange(NBYTES // 4, dtype=torch.float32))


def test_a_shared_memory_edge_between_them_fails_naming_both_hosts(
    ray_on_twins, producer_and_consumer
):
    _, ref, _, error = _send(ray_on_twins, producer_and_consumer, "shared_memory")
    assert "cannot map its /dev/shm" in error and ref.handle[0] in error
    assert error.count(socket.gethostname() + "#") == 2


def test_a_consumer_node_that_has_not_said_which_host_it_is_on_gets_no_plain_shared_memory(
    ray_on_twins, producer_and_consumer
):
    """A consumer whose node has announced nothing (a reader outside Serve) is still sent a
    payload it can read; its node is asked meanwhile, and the answer says: another host."""
    from omni_serve.transport import hosts

    ray = ray_on_twins
    other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "host_b" in n["Resources"])
    hosts.forget(other)
    one_host, ref, _, got = _send(ray, producer_and_consumer, "auto")
    assert one_host is None and ref.backend == "shared_memory_direct"
    assert torch.equal(got, torch.arange(NBYTES // 4, dtype=torch.float32))
    producer, _ = producer_and_consumer
    assert ray.get(producer.settle.remote(60))[1] is False
    assert hosts.recorded(other) not in (None, hosts.host_id())
