"""User story: two stages on different Ray nodes exchange tensors over the channel: the object
store works from any node, the direct backend reads across nodes over TCP (UCX_TLS=tcp: the
wire between two hosts), and on nodes that share a host the default (auto) channel picks
shared memory and still delivers (once it knows they share one: a node that has not said is
asked)."""

from __future__ import annotations

import time

import pytest
import torch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    yield ray
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.parametrize("backend", ["object_store", "direct", "auto"])
def test_a_payload_crosses_nodes(two_nodes, backend):
    ray = two_nodes
    tcp_only = {"env_vars": {"UCX_TLS": "tcp"}}

    @ray.remote(num_cpus=0, resources={"node_a": 0.1}, runtime_env=tcp_only)
    class Producer:
        def put(self, backend: str):
            from omni_serve.transport import make_channel

            payload = {
                "rows": torch.arange(1 << 20, dtype=torch.float32).view(1024, 1024),
                "mask": torch.ones(1024, dtype=torch.bool),
            }
            node = ray.get_runtime_context().get_node_id()
            return node, make_channel(backend).put(payload)

    @ray.remote(num_cpus=0, resources={"node_b": 0.1}, runtime_env=tcp_only)
    class Consumer:
        def __init__(self) -> None:
            from omni_serve.transport import announce

            announce()  # as every stage replica does when it starts

        async def take(self, ref):
            from omni_serve.transport import take

            got = await take(ref)
            node = ray.get_runtime_context().get_node_id()
            return node, float(got["rows"].sum()), int(got["mask"].sum()), ref.backend

    producer, consumer = Producer.remote(), Consumer.remote()
    ray.get(consumer.__ray_ready__.remote())
    produced_on, ref = ray.get(producer.put.remote(backend))
    consumed_on, total, ones, used = ray.get(consumer.take.remote(ref))
    assert produced_on != consumed_on
    assert total == float(torch.arange(1 << 20, dtype=torch.float32).sum()) and ones == 1024
    assert used == ("shared_memory" if backend == "auto" else backend)


def test_a_node_that_has_not_said_which_host_it_is_on_is_asked(two_nodes):
    """Until it answers, the check says "not known" (auto then keeps off plain shared memory);
    the answer, recorded for every process, settles it: one host."""
    from omni_serve.transport import hosts

    ray = two_nodes
    other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_b" in n["Resources"])
    hosts.forget(other)
    verdicts = [hosts.cluster_is_one_host()]
    deadline = time.monotonic() + 60
    while verdicts[-1] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        verdicts.append(hosts.cluster_is_one_host())
    assert verdicts[0] is None and verdicts[-1] is True, verdicts
    assert hosts.recorded(other) == hosts.host_id()
