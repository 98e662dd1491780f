"""Host ids: processes share a host when they can map each other's /dev/shm, whatever their
hostnames say (containers on the host's network share its hostname, not its /dev/shm)."""

from __future__ import annotations

import functools
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_serve.transport import ChannelFull, SharedMemoryChannel, hosts, make_channel, take
from omni_serve.transport.channels import _overflow as overflow
from omni_serve.transport.hosts import (
    cluster_is_one_host,
    describe_host,
    host_id,
    one_host,
    ray_is_running,
)


def test_a_host_id_is_the_hostname_plus_the_machine_boot_and_dev_shm_mount(tmp_path):
    boot, other_boot = tmp_path / "boot", tmp_path / "other_boot"
    boot.write_text("5d1c\n")
    other_boot.write_text("77aa\n")
    shm, other_shm = Path("/dev/shm"), tmp_path / "shm"
    other_shm.mkdir()
    same = describe_host("node", shm, boot)
    assert same == describe_host("node", shm, boot) and same.startswith("node#")
    assert describe_host("node", other_shm, boot) != same  # another mount: another host
    assert describe_host("node", shm, other_boot) != same  # another machine (or boot)
    assert describe_host("other", shm, boot).split("#")[1] == same.split("#")[1]
    assert describe_host("node", shm, tmp_path / "missing").startswith("node#")  # not Linux


def _node(node_id: str, hostname: str) -> dict:
    return {"NodeID": node_id, "NodeManagerHostname": hostname, "Alive": True}


@pytest.mark.parametrize(
    ("nodes", "recorded", "expected"),
    [
        ([], {}, True),  # no node but this process's own
        ([_node("a", "h")], {"a": "h#1"}, True),
        ([_node("a", "h"), _node("b", "h")], {"a": "h#1", "b": "h#1"}, True),
        ([_node("a", "h"), _node("b", "h")], {"a": "h#1"}, None),  # b not recorded yet
        ([_node("a", "h"), _node("b", "h")], {"a": "h#1", "b": "h#2"}, False),  # containers
        ([_node("b", "h"), _node("a", "h")], {"a": "h#2"}, False),  # known elsewhere wins
        ([_node("a", "h"), _node("b", "g")], {"b": "h#1"}, False),  # another hostname
    ],
)
def test_nodes_are_one_host_when_all_recorded_this_id_and_unknown_while_any_is_silent(
    nodes, recorded, expected
):
    looked_up: list[str] = []

    def announced(node_id: str) -> str | None:
        looked_up.append(node_id)
        return recorded.get(node_id)

    assert one_host(nodes, "h", "h#1", announced) is expected
    elsewhere = {node["NodeID"] for node in nodes if node["NodeManagerHostname"] != "h"}
    assert not elsewhere & set(looked_up)  # another hostname is another host: no lookup


READ_IN_A_PRIVATE_DEV_SHM = """
import asyncio, pickle, socket, sys
from omni_serve.transport import ChannelError, take
from omni_serve.transport.hosts import host_id
ref = pickle.loads(bytes.fromhex(sys.argv[1]))
try:
    asyncio.run(take(ref))
    print("read", flush=True)
except ChannelError as exc:
    print(socket.gethostname(), host_id(), exc, sep="\\n", flush=True)
"""


async def test_a_process_with_a_dev_shm_of_its_own_is_another_host_with_one_hostname():
    """As a container on the host's network sees a ref made outside it: the error says why,
    not that the ref was freed."""
    ref = SharedMemoryChannel().put(torch.arange(300_000, dtype=torch.float32))
    inside = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs /dev/shm && exec "$0" -c "$1" "$2"',
        sys.executable,
        READ_IN_A_PRIVATE_DEV_SHM,
        pickle.dumps(ref).hex(),
    ]
    done = subprocess.run(inside, capture_output=True, text=True, timeout=120)
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here (needs root): {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    hostname, their_id, error = done.stdout.strip().split("\n", 2)
    assert hostname == socket.gethostname() and their_id != host_id()
    assert host_id() in error and their_id in error and "cannot map its /dev/shm" in error
    assert torch.equal(await take(ref), torch.arange(300_000, dtype=torch.float32))  # intact


def test_a_dead_nodes_entry_is_dropped_once(monkeypatch):
    """So the KV holds one host id per live node, not one per node ever started."""
    from omni_serve.compat import ray_serve
    from omni_serve.transport import hosts

    deleted: list[str] = []
    monkeypatch.setattr(ray_serve, "kv_del", deleted.append)
    monkeypatch.setattr(hosts, "_forgotten", set())
    records = [_node("alive", "h"), {**_node("dead", "h"), "Alive": False}]
    hosts._forget_dead(records)
    hosts._forget_dead(records)
    assert deleted == ["host_id/dead"]


def test_auto_looks_again_soon_while_a_node_has_not_said_and_keeps_off_plain_shared_memory(
    monkeypatch,
):
    """Unknown counts as more than one host, checked again after a second, not a minute."""
    from omni_serve.transport import channels as transport

    verdicts = iter([None, True])
    checks: list[int] = []

    def check() -> bool | None:
        checks.append(1)
        return next(verdicts)

    monkeypatch.setattr(transport, "cluster_is_one_host", check)
    monkeypatch.setattr(transport, "UNSETTLED_TTL_S", 0.0)
    auto = transport.AutoChannel()
    assert auto.spans_hosts() and not auto.spans_hosts()  # unknown, then one host
    assert not auto.spans_hosts() and len(checks) == 2  # settled: once a minute from now


def test_a_process_that_joins_another_cluster_records_its_new_node(monkeypatch):
    """A driver that shuts Ray down and joins another cluster is on another node there; its
    asks in the old cluster are dropped (never to be waited on)."""
    import ray

    from omni_serve.compat import ray_serve
    from omni_serve.transport import hosts

    node = ["n1"]
    written: list[str] = []
    context = type("Context", (), {"get_node_id": lambda self: node[0]})()
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    monkeypatch.setattr(ray_serve, "kv_put", lambda key, value: written.append(key))
    monkeypatch.setattr(hosts, "_announced_on", None)
    monkeypatch.setattr(hosts, "_asking", {"old-node": object()})
    hosts.announce()
    hosts.announce()
    node[0] = "n2"
    hosts.announce()
    assert written == ["host_id/n1", "host_id/n2"] and hosts._asking == {}


def test_a_node_that_never_answers_is_named_in_the_log_once(monkeypatch, caplog):
    """A node that cannot start the pinned task (no room for a worker, say) keeps plain shared
    memory off; the operator reads which node, once, not a silent slowdown."""
    import ray

    from omni_serve.transport import hosts

    SILENT = "ab" * 28  # a node id: 28 hex bytes

    class Reporter:
        def options(self, **_):
            return self

        def remote(self):
            return "never-done"

    monkeypatch.setattr(hosts, "_reporter", Reporter)
    monkeypatch.setattr(ray, "wait", lambda pending, **_: ([], pending))
    monkeypatch.setattr(hosts, "_asking", {})
    monkeypatch.setattr(hosts, "_warned", set())
    monkeypatch.setattr(hosts, "ASK_WARN_AFTER_S", 3600.0)
    hosts._ask([SILENT])
    assert SILENT not in caplog.text  # asked just now: nothing to say yet
    monkeypatch.setattr(hosts, "ASK_WARN_AFTER_S", -1.0)
    hosts._ask([SILENT])
    hosts._ask([SILENT])
    said = [r for r in caplog.records if SILENT in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", said
    assert list(hosts._asking) == [SILENT]  # still asked: an answer may yet come


async def test_without_ray_installed_payloads_go_and_come_back_on_one_host(monkeypatch):
    """A process without Ray (a stage's torch code on a machine without it, a benchmark's
    spawned consumer) is one host on its own. Found on a lent GPU machine, where every take
    failed with "No module named 'ray'"."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setattr(hosts, "_ray", functools.cache(hosts._ray.__wrapped__))  # looks anew
    assert not ray_is_running() and cluster_is_one_host()
    want = torch.arange(1 << 15, dtype=torch.float32)  # 128 KB: over inline, a small segment
    ref = make_channel().put(want)
    assert ref.backend == "shared_memory"
    assert torch.equal(await take(ref), want)
    with pytest.raises(ChannelFull):  # no object store to overflow to
        overflow(ChannelFull("segments full"))
