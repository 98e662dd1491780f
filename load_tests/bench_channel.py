"""Tensor channel benchmark: one payload from a producer actor to a consumer actor, per backend
and size, against plain pickled arguments and a single-thread memcpy in the same run.

    .venv/bin/python load_tests/bench_channel.py [--repeats 3]   # ~85 s a run
    .venv/bin/python load_tests/bench_channel.py --cross-node     # ~2 min
    .venv/bin/python load_tests/bench_channel.py --two-hosts     # ~3 min, as root

A round is: the producer ``put``s a preallocated float32 tensor (the copy into the channel is
counted) and returns the ref; the consumer ``get``s it and answers its size. "pickled" sends
the tensor itself as the actor-call argument (what a DeploymentHandle call does with it);
"copy" only copies it inside the producer (the one copy a channel cannot avoid, as a reference).
"direct" is the NIXL backend on this host (UCX picks shared memory / CMA); "direct_tcp" the
same with UCX held to TCP, as between two hosts.
Added latency = round minus the same two calls with no payload, measured in pairs (an empty
round right before each payload round); "gbps" counts the whole round,
"transfer_gbps" only the added part. In "auto_read" and "copy_read" rounds the consumer also
reads (sums) what it got, as a stage does. "stream_gbps" (one node; auto, object_store, pickled,
copy): bursts of payloads sent back to back, all in flight, as a stage streaming chunks sends
them. Writes
load_tests/results/bench_channel.json (every run), keeps docs/results/channel.json (one node:
the headline figures over the runs) and prints a table. Targets (issue 5): the chosen
backend >= 50% of memcpy at >= 16 MB (>= 10x pickled); 4 KB adds < 1 ms. memcpy is given hot
(two buffers, L3-resident up to 16 MB here) and cold (buffers rotated over 512 MB: DRAM-bound).

``--cross-node``: the producer and the consumer on two Ray nodes of one machine
(``ray.cluster_utils.Cluster``; each node has its own raylet and object store, so an object
store ref or a pickled argument is pulled by the consumer's node over the object manager, and
the direct backend reads over UCX TCP), loopback standing in for the wire. Only the backends
that cross nodes: ``auto`` picks shared memory on nodes that share a host (the same as the
one-node run). Writes ``load_tests/results/bench_channel_cross_node.json``.

``--two-hosts`` (root): the consumer's node on a second host made of namespaces on this machine
(its own network behind a veth pair, hostname, /dev/shm and PIDs:
``omni_serve.testing.two_hosts``), so ``auto`` sees two hosts and picks shared memory lent
to NIXL (``shared_memory_direct``), and UCX has nothing but TCP over the veth. The ``_beside``
rounds take the payload in a consumer on the producer's host instead: ``auto_beside`` maps the
segment, ``direct_beside`` is what ``auto`` picked across hosts before (the direct backend, two
copies). Writes ``load_tests/results/bench_channel_two_hosts.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from channel_baselines import in_process_ms, memcpy_gbps  # noqa: E402
from channel_figures import cross_node_figures, kept_figures, one_node_targets  # noqa: E402
from summary import write_summary  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
RESULTS = Path(__file__).parent / "results"
SIZES = {"4KB": 4 << 10, "1MB": 1 << 20, "16MB": 16 << 20, "64MB": 64 << 20, "256MB": 256 << 20}
BACKENDS = [
    "auto",
    "shared_memory",
    "direct",
    "direct_tcp",
    "object_store",
    "pickled",
    "copy",
    "auto_read",
    "copy_read",
]
# direct_tcp: the direct backend with UCX limited to TCP, the wire it uses between two hosts
# (its actors run with UCX_TLS=tcp); the cross-host throughput this machine can measure.
TCP_ONLY = {"env_vars": {"UCX_TLS": "tcp"}}
# Rounds that are not a channel of their own. "copy": the producer copies the tensor into a
# private buffer and the calls carry only its size: the floor for any channel that copies once,
# since a copy inside a round runs with caches the two calls (and the other actor) just used.
EXTRA = {
    "pickled": None,
    "direct_tcp": "direct",
    "copy": None,
    "auto_read": "auto",
    "copy_read": None,
    "auto_beside": "auto",
    "direct_beside": "direct",
}
# "_read": the consumer also reads the whole payload (a sum), as a stage does; the copy round's
# consumer reads a private tensor of the size. What a read costs beyond reading memory the
# consumer has mapped (a fresh mapping's pages fault in) shows as auto_read minus copy_read.
# Streamed too (one node): the backends a one-host edge would use, and the references.
STREAM_BACKENDS = ["auto", "object_store", "pickled", "copy"]
STREAM_BURST_BYTES = 256 << 20
CROSS_NODE_BACKENDS = ["object_store", "direct_tcp", "pickled", "copy"]
TWO_HOSTS_BACKENDS = [
    "auto",
    "object_store",
    "direct",
    "pickled",
    "copy",
    "auto_beside",
    "direct_beside",
]
NODE_STORE_BYTES = 2 << 30  # each node's object store: 256 MB payloads with room to spare


def stream_gbps(producer, consumer, nbytes: int, backend: str) -> float:
    """Throughput with payloads in flight back to back (median of 5 bursts after one to warm
    up; a burst holds ~256 MB, 2 to 16 payloads), as a stage streaming chunks sees it."""
    import ray

    count = max(2, min(16, STREAM_BURST_BYTES // nbytes))
    seconds = [ray.get(producer.stream.remote(nbytes, backend, count, consumer)) for _ in range(6)][
        1:
    ]
    return nbytes * count / statistics.median(seconds) / 1e9


def start_ray(mode: str):
    """Ray on one node, on two nodes of this machine, or on two hosts made of namespaces;
    what stops the nodes after, if anything."""
    import ray

    if mode == "one_node":
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        return None
    if mode == "two_hosts":
        from omni_serve.testing.two_hosts import TwoHosts

        hosts = TwoHosts(object_store_bytes=NODE_STORE_BYTES, shm_size="3g")
        hosts.start()
        ray.init(address=hosts.address, log_to_driver=False)
        return hosts.stop
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "object_store_memory": NODE_STORE_BYTES,
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=NODE_STORE_BYTES)
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster.shutdown


def main() -> int:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cross-node", action="store_true", help="producer, consumer on 2 nodes")
    parser.add_argument(
        "--two-hosts",
        action="store_true",
        help="producer, consumer on 2 hosts made of namespaces (root)",
    )
    parser.add_argument(
        "--copy-threads",
        type=int,
        default=None,
        help="threads for the channel's copy (default: the library's)",
    )
    parser.add_argument(
        "--split-copy-from",
        type=int,
        default=None,
        metavar="BYTES",
        help="payload size from which the copy is split over threads "
        "(default: the library's, 32 MiB)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs over all sizes")
    args = parser.parse_args()
    mode = "two_hosts" if args.two_hosts else "cross_node" if args.cross_node else "one_node"
    if args.copy_threads is not None:  # before Ray and the library start: workers inherit it
        os.environ["OMNI_CHANNEL_COPY_THREADS"] = str(args.copy_threads)
    if args.split_copy_from is not None:
        os.environ["OMNI_CHANNEL_SPLIT_COPY_FROM"] = str(args.split_copy_from)
    backends = {
        "one_node": BACKENDS,
        "cross_node": CROSS_NODE_BACKENDS,
        "two_hosts": TWO_HOSTS_BACKENDS,
    }[mode]
    stop_nodes = start_ray(mode)
    # Producer on one node (host), consumer on the other, or both anywhere.
    places = {
        "one_node": ({}, {}),
        "cross_node": ({"resources": {"node_a": 0.1}}, {"resources": {"node_b": 0.1}}),
        "two_hosts": ({"resources": {"host_a": 0.1}}, {"resources": {"host_b": 0.1}}),
    }[mode]

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self) -> None:
            from omni_serve.transport import make_channel

            torch.set_num_threads(1)
            self.tensors = {n: torch.ones(n // 4) for n in SIZES.values()}
            self.copies = {n: torch.empty(n // 4) for n in SIZES.values()}
            # One channel per backend, as a stage holds one per edge.
            names = {EXTRA.get(b, b) for b in backends} - {None}
            self.channels = {name: make_channel(name) for name in names}

        def put(self, nbytes: int, backend: str):
            tensor = self.tensors[nbytes]
            if backend == "pickled":
                return tensor
            if backend in ("copy", "copy_read"):  # the channel's copy, into private memory
                from omni_serve.transport.copying import copy_bytes

                copy_bytes(self.copies[nbytes].view(torch.uint8), tensor.view(torch.uint8))
                return nbytes
            return self.channels[EXTRA.get(backend, backend)].put(tensor)

        def noop(self) -> None:
            return None

        def stream(self, nbytes: int, backend: str, count: int, consumer) -> float:
            """``count`` payloads sent back to back, each its own call to the consumer, all in
            flight at once: seconds until the consumer has taken the last."""
            start = time.perf_counter()
            calls = [consumer.get.remote(self.put(nbytes, backend)) for _ in range(count)]
            assert ray.get(calls) == [nbytes] * count
            return time.perf_counter() - start

    @ray.remote(num_cpus=0)
    class Consumer:
        def __init__(self) -> None:
            torch.set_num_threads(1)
            self.private = {n: torch.ones(n // 4) for n in SIZES.values()}

        async def get(self, ref, read: bool = False) -> int:
            from omni_serve.transport import take

            if isinstance(ref, int):  # the "copy" round: nothing travels
                if read:
                    self.private[ref].sum()
                return ref
            tensor = ref if isinstance(ref, torch.Tensor) else await take(ref)
            if read:
                tensor.sum()
            return tensor.numel() * tensor.element_size()

        async def noop(self, _=None) -> None:  # async like get: the same kind of call
            return None

    pairs = {
        "default": (Producer.options(**places[0]).remote(), Consumer.options(**places[1]).remote()),
        "tcp": (
            Producer.options(runtime_env=TCP_ONLY, **places[0]).remote(),
            Consumer.options(runtime_env=TCP_ONLY, **places[1]).remote(),
        ),
    }
    producer, consumer = pairs["default"]
    if mode == "two_hosts":  # a consumer on the producer's host, for the _beside rounds
        pairs["beside"] = (producer, Consumer.options(**places[0]).remote())

    def timed_round(nbytes: int, backend: str) -> float:
        pair = "tcp" if backend == "direct_tcp" else "beside" if "_beside" in backend else "default"
        producer, consumer = pairs[pair]
        start = time.perf_counter()
        read = backend.endswith("_read")
        got = ray.get(consumer.get.remote(producer.put.remote(nbytes, backend), read))
        assert got == nbytes
        return time.perf_counter() - start

    def empty_round() -> float:
        start = time.perf_counter()
        ray.get(consumer.noop.remote(producer.noop.remote()))
        return time.perf_counter() - start

    settle = time.monotonic() + 5.0  # Ray's helper processes are still starting at first
    while time.monotonic() < settle:
        empty_round()
    overhead = statistics.median(empty_round() for _ in range(50))

    def measure_rows() -> list[dict]:
        rows = []
        for label, nbytes in SIZES.items():
            rows.append(measure_size(label, nbytes))
        return rows

    def measure_size(label: str, nbytes: int) -> dict:
        repeats = 30 if nbytes <= 64 << 20 else 8
        row = {
            "size": label,
            "nbytes": nbytes,
            "memcpy_gbps": memcpy_gbps(nbytes, repeats),
            "memcpy_cold_gbps": memcpy_gbps(nbytes, repeats, cold=True),
            "shared_memory_in_process": in_process_ms(nbytes, repeats),
        }
        for backend in backends:
            timed_round(nbytes, backend)  # warm-up
            # Each round paired with an empty one right before it: the machine's load drifts
            # over a run (the empty round moved 1.4 -> 2.2 ms between runs on this machine), so
            # what a payload adds is measured against the overhead of the same minute.
            empties, rounds = [], []
            for _ in range(repeats):
                empties.append(empty_round())
                rounds.append(timed_round(nbytes, backend))
            latency, paired = statistics.median(rounds), statistics.median(empties)
            row[backend] = {
                "empty_round_ms": paired * 1e3,
                "latency_ms": latency * 1e3,
                "added_ms": (latency - paired) * 1e3,
                "gbps": nbytes / latency / 1e9,
                "transfer_gbps": nbytes / max(latency - paired, 1e-6) / 1e9,
            }
        if mode == "one_node":
            for backend in STREAM_BACKENDS:
                row[backend]["stream_gbps"] = stream_gbps(producer, consumer, nbytes, backend)
        print(
            f"{label:>6}  memcpy {row['memcpy_gbps']:6.2f} GB/s "
            f"(cold {row['memcpy_cold_gbps']:6.2f})  "
            + "  ".join(
                f"{b} {row[b]['gbps']:6.2f} GB/s {row[b]['added_ms']:7.2f} ms" for b in backends
            ),
            flush=True,
        )
        return row

    runs = []
    for repeat in range(args.repeats):
        print(f"run {repeat + 1}/{args.repeats}", flush=True)
        runs.append(measure_rows())
    rows = runs[-1]
    ray.shutdown()
    if stop_nodes is not None:
        stop_nodes()

    name = "bench_channel.json" if mode == "one_node" else f"bench_channel_{mode}.json"
    one_node = mode == "one_node"
    targets = one_node_targets(rows) if one_node else cross_node_figures(rows, backends)
    from omni_serve.transport.copying import COPY_THREADS, PARALLEL_FROM

    summary = {
        "copy_threads": COPY_THREADS,
        "split_copy_from_bytes": PARALLEL_FROM,
        "empty_round_ms_at_start": overhead * 1e3,
        "rows": rows,
        "targets": targets,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(summary, indent=1))
    if one_node:
        sides = {
            "producer and consumer": "two Ray actors on this host, 1 torch thread each",
            "memcpy": "one thread in one process, hot and cold buffers",
            "copy_threads": COPY_THREADS,
        }
        kept = write_summary("channel", kept_figures(runs), sides, args.repeats)
        print(f"summary: {kept}")
    print("targets:", json.dumps(summary["targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
