"""Which processes share a host, in the sense the shared-memory backends need: the ones that
can map each other's ``/dev/shm``. The hostname alone does not say so. Containers run with the
host's network (``docker run --net=host``, ``hostNetwork: true``) take the machine's hostname,
but each container gets its own ``/dev/shm`` unless it also shares the host's IPC. Two Ray nodes
in two such containers would look like one host, and a shared-memory ref made in one could not
be opened in the other.

A host id is the hostname (so errors stay readable) plus a digest of the machine's boot id and
the identity (device, inode) of the ``/dev/shm`` mount. Ray records only each node's hostname.
So every process that makes or reads channel payloads writes its node's host id to Ray's
key-value store once (``announce``), and the locality check compares ids where a node has
written one. Stage replicas announce at start, so a replica that can be sent a ref has
announced before any producer looks. A node with this hostname that has announced nothing (no
stage there yet, or a consumer outside Serve) is asked: a small task pinned to it announces for
it. Until its answer is in, the cluster counts as more than one host, so a producer never picks
plain shared memory for a reader that may not be able to map it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from omni_serve.compat import ray_serve

SHM_DIR = Path("/dev/shm")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_KEY = "host_id/{node}"
# An ask unanswered this long is said in the log (once per node): a node that cannot start a
# worker (no room, a broken runtime env) would otherwise keep plain shared memory off silently.
ASK_WARN_AFTER_S = 60.0
_announced_on: str | None = None  # the node this process last recorded
# Nodes asked for their host id: the pending task per node (and when it was started), and the
# answers (kept here too, so the check works where Ray's KV does not).
_asking: dict[str, tuple[Any, float]] = {}
_warned: set[str] = set()
_answers: dict[str, str] = {}
_forgotten: set[str] = set()
logger = logging.getLogger(__name__)


@functools.cache
def host_id() -> str:
    """This process's host id (computed once: neither the mount nor the boot changes under a
    running process)."""
    return describe_host(socket.gethostname(), SHM_DIR, BOOT_ID)


def describe_host(hostname: str, shm_dir: Path, boot_id: Path) -> str:
    """``hostname#digest``. Two processes share shared memory exactly when they see the same
    tmpfs at ``shm_dir`` on the same boot of the same machine. Inode and device numbers
    alone can repeat on another machine; the boot id does not."""
    try:
        boot = boot_id.read_text().strip()
    except OSError:  # not Linux: the hostname and the mount still tell hosts apart
        boot = ""
    try:
        mount = os.stat(shm_dir)
        where = f"{mount.st_dev}:{mount.st_ino}"
    except OSError:
        where = "no-shm"
    digest = hashlib.blake2s(f"{boot}/{where}".encode(), digest_size=4).hexdigest()
    return f"{hostname}#{digest}"


@functools.cache
def _ray() -> Any:
    """The ``ray`` module, or None where Ray is not installed (looked for once: this is asked
    on every put and take, and a failed import is not cached by Python)."""
    try:
        import ray
    except ImportError:
        return None
    return ray


def ray_is_running() -> bool:
    """Whether this process is in a Ray cluster. False also where Ray is not installed: the
    channel runs without Ray too (a stage's torch code on a lent GPU machine, a benchmark's
    spawned consumer), with every process on one host."""
    ray = _ray()
    return ray is not None and ray.is_initialized()


def announce() -> None:
    """Record this node's host id once per process and node (a driver that shuts Ray down and
    joins another cluster is on another node). It is written by node id, so a restarted node
    writes a new entry and the dead one's is never read again."""
    global _announced_on
    if not ray_is_running():
        return
    import ray

    node = ray.get_runtime_context().get_node_id()
    if node == _announced_on:
        return
    _announced_on = node
    _asking.clear()  # tasks of a cluster this process has left: never to be waited on
    ray_serve.kv_put(_KEY.format(node=node), host_id())


def cluster_is_one_host() -> bool | None:
    """True when every alive Ray node shares this process's ``/dev/shm`` (or Ray is not
    running here), so any consumer can map a shared-memory payload made here. None while some
    node with this hostname has not said yet (it has been asked; treat as False and look again
    soon)."""
    if not ray_is_running():
        return True
    import ray

    announce()  # this node's own entry, for the others' checks
    here = ray.get_runtime_context().get_node_id()
    records = ray.nodes()
    _forget_dead(records)
    nodes = [node for node in records if node.get("Alive") and node["NodeID"] != here]
    silent: list[str] = []

    def announced(node: str) -> str | None:
        known = recorded(node) or _answers.get(node)
        if known is None:
            silent.append(node)
        return known

    verdict = one_host(nodes, socket.gethostname(), host_id(), announced)
    if verdict is None:
        _ask(silent)
    return verdict


def one_host(
    nodes: Iterable[dict], hostname: str, me: str, announced: Callable[[str], str | None]
) -> bool | None:
    """Whether every node in ``nodes`` (Ray's node records) is on host ``me``: False as soon
    as one is not, None when none is known not to be but some have recorded no id. Another
    hostname means another host. Only nodes with this hostname are looked up (``announced``:
    a node's recorded host id, or None)."""
    unknown = False
    for node in nodes:
        if node.get("NodeManagerHostname") != hostname:
            return False
        recorded = announced(node["NodeID"])
        if recorded is None:
            unknown = True
        elif recorded != me:
            return False
    return None if unknown else True


def _report_host_id() -> str:
    announce()
    return host_id()


@functools.cache
def _reporter() -> Any:  # a Ray remote function
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_report_host_id)


def _ask(nodes: Iterable[str]) -> None:
    """Start a pinned task on each node not being asked yet, and collect the answers that are
    in, without waiting (this runs inside a put, often on a replica's event loop). A task that
    failed (its node died, say) is dropped, so the node is asked again next time."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for node in nodes:
        if node not in _asking:
            pinned = NodeAffinitySchedulingStrategy(node, soft=False)
            task = _reporter().options(scheduling_strategy=pinned).remote()
            _asking[node] = (task, time.monotonic())
    pending = [task for task, _ in _asking.values()]
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
    for node, (task, since) in list(_asking.items()):
        if task in done:
            del _asking[node]
            try:
                _answers[node] = ray.get(task)
            except ray.exceptions.RayError as exc:
                logger.info("could not ask node %s for its host id (%s)", node, exc)
        elif time.monotonic() - since > ASK_WARN_AFTER_S and node not in _warned:
            _warned.add(node)
            logger.warning(
                "node %s shares this hostname but has not said which host it is on for %.0f s "
                "(it may not be able to start a worker); until it does, payloads from here go "
                "through shared_memory_direct or the object store, not plain shared memory",
                node,
                ASK_WARN_AFTER_S,
            )


def recorded(node: str) -> str | None:
    """The host id ``node`` recorded, if any."""
    return ray_serve.kv_get(_KEY.format(node=node))


def forget(node: str) -> None:
    """Drop what is known of ``node``'s host (its KV entry, and this process's answer)."""
    _answers.pop(node, None)
    ray_serve.kv_del(_KEY.format(node=node))


def _forget_dead(records: Iterable[dict]) -> None:
    """Drop dead nodes' entries (each process once per node), so the KV keeps one key per
    live node rather than one per node ever started."""
    for node in records:
        node_id = node["NodeID"]
        if not node.get("Alive") and node_id not in _forgotten:
            _forgotten.add(node_id)
            forget(node_id)
