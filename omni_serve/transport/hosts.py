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
written one. Stage replicas announce at start, because they make their edges' channels then.
A node that has announced nothing is compared by hostname, as before.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

from omni_serve.compat import ray_serve

SHM_DIR = Path("/dev/shm")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_KEY = "host_id/{node}"
_announced = False


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


def announce() -> None:
    """Record this node's host id once per process, when Ray runs. It is written by node id,
    so a restarted node writes a new entry and the dead one's is never read again."""
    global _announced
    if _announced:
        return
    import ray

    if not ray.is_initialized():
        return
    _announced = True
    node = ray.get_runtime_context().get_node_id()
    ray_serve.kv_put(_KEY.format(node=node), host_id())


def cluster_is_one_host() -> bool:
    """True when every alive Ray node shares this process's ``/dev/shm`` (or Ray is not
    running here), so any consumer can map a shared-memory payload made here."""
    import ray

    if not ray.is_initialized():
        return True
    announce()  # this node's own entry, for the others' checks
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    return one_host(nodes, socket.gethostname(), host_id(),
                    lambda node: ray_serve.kv_get(_KEY.format(node=node)))  # fmt: skip


def one_host(nodes: Iterable[dict], hostname: str, me: str,
             announced: Callable[[str], str | None]) -> bool:  # fmt: skip
    """Whether every node in ``nodes`` (Ray's node records) is on host ``me``. Another
    hostname means another host. A node with this hostname is looked up (``announced``: its
    recorded host id, or None), and only those nodes are looked up."""
    for node in nodes:
        if node.get("NodeManagerHostname") != hostname:
            return False
        recorded = announced(node["NodeID"])
        if recorded is not None and recorded != me:
            return False
    return True
