"""Two hosts on one machine, for tests of what crosses hosts: a Ray head node here and a Ray
worker node in namespaces of its own (network behind a veth pair, hostname, /dev/shm, System V
IPC, PIDs). The two share the kernel, the CPUs and the filesystem (the venv, the model cache,
Ray's session directory) and nothing a transport could use as a shortcut: the worker cannot map
this host's shared memory, see its processes, or reach it but over the veth, as between two
machines. ``ray.cluster_utils.Cluster`` nodes share all of that, so there ``auto`` picks shared
memory and the cross-host paths run only when pinned.

Needs root (``ip netns``, ``unshare``, mounting a tmpfs). Started processes run in their own
process groups and are stopped by those, never with ``ray stop`` (it kills every Ray process on
the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from omni_serve.compat.ray_serve import forget_cluster_address

RAY = str(Path(sys.executable).with_name("ray"))


class HostsUnavailable(RuntimeError):
    """The namespaces or the veth pair could not be made here (not root, no iproute2)."""


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsUnavailable(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


@dataclass
class TwoHosts:
    """``start()`` then ``ray.init(address=hosts.address)``; ``stop()`` undoes everything.
    Each node has one CPU and a custom resource naming it (``host_a``, ``host_b``) to pin
    actors with."""

    namespace: str = "omni-host-b"
    hostname: str = "omni-host-b"
    head_ip: str = "10.211.0.1"
    other_ip: str = "10.211.0.2"
    shm_size: str = "2g"  # host b's own /dev/shm
    object_store_bytes: int = 512 << 20  # each node's (host b's in its own /dev/shm)
    port: int = 0  # the head's GCS port; 0: a free one
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)  # each node's output, read when one fails

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def start(self, timeout_s: float = 90.0) -> None:
        self._remove_namespace()  # left by a run that was killed
        veth_a, veth_b = f"{self.namespace[:10]}-a", f"{self.namespace[:10]}-b"
        in_ns = ("ip", "netns", "exec", self.namespace)
        _run("ip", "netns", "add", self.namespace)
        try:
            _run("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
            _run("ip", "link", "set", veth_b, "netns", self.namespace)
            _run("ip", "addr", "add", f"{self.head_ip}/24", "dev", veth_a)
            _run("ip", "link", "set", veth_a, "up")
            _run(*in_ns, "ip", "addr", "add", f"{self.other_ip}/24", "dev", veth_b)
            _run(*in_ns, "ip", "link", "set", veth_b, "up")
            _run(*in_ns, "ip", "link", "set", "lo", "up")
            self.port = self.port or _free_port(self.head_ip)
            self._start_head()
            self._start_other(in_ns)
            self._wait_for_nodes(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start_head(self) -> None:
        self._spawn(
            [
                RAY,
                "start",
                "--head",
                "--block",
                f"--node-ip-address={self.head_ip}",
                f"--port={self.port}",
                "--num-cpus=1",
                '--resources={"host_a": 1}',
                f"--object-store-memory={self.object_store_bytes}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ]
        )

    def _start_other(self, in_ns: tuple[str, ...]) -> None:
        resources = json.dumps({"host_b": 1})
        ray = (
            f"exec {RAY} start --block --address={self.address} --num-cpus=1 "
            f"--node-ip-address={self.other_ip} '--resources={resources}' "
            f"--object-store-memory={self.object_store_bytes}"
        )
        inside = (
            f"mount -t tmpfs -o size={self.shm_size} tmpfs /dev/shm && "
            f"hostname {self.hostname} && {ray}"
        )
        # --kill-child: when unshare goes (SIGTERM from stop()), the namespace's first process
        # gets a SIGKILL, and every process of the namespace dies with it (a namespace's first
        # process ignores a SIGTERM from outside it).
        self._spawn(
            [
                *in_ns,
                "unshare",
                "--uts",
                "--ipc",
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "sh",
                "-c",
                inside,
            ]
        )

    def _spawn(self, argv: list[str]) -> None:
        """A node in its own process group; its output to a file (a pipe nobody reads until a
        failure would fill and block the node)."""
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        fd, log = tempfile.mkstemp(prefix="omni-two-hosts-", suffix=".log")
        with os.fdopen(fd, "w") as out:
            self.processes.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    start_new_session=True,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        self.logs.append(Path(log))

    def _wait_for_nodes(self, timeout_s: float) -> None:
        """Until both nodes are alive (a fresh driver asks GCS, then leaves)."""
        probe = (
            "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise HostsUnavailable(f"a Ray node exited: {log.read_text()[-2000:]}")
            done = subprocess.run(
                [sys.executable, "-c", probe, self.address],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode == 0 and done.stdout.strip().endswith("2"):
                return
            time.sleep(1.0)
        raise HostsUnavailable(f"two Ray nodes were not up within {timeout_s:.0f} s")

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM each node's process group, SIGKILL what is left after ``grace_s`` (the
        head's ``ray start`` takes ~33 s to stop on a SIGTERM; nothing here needs that), then
        the namespace (its end of the veth goes with it, and the pair with that), then the
        head's address in Ray's current-cluster file (``ray stop`` would remove it)."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.processes.clear()
        for log in self.logs:
            log.unlink(missing_ok=True)
        self.logs.clear()
        self._remove_namespace()
        forget_cluster_address(self.address)  # else a later bare ray.init() joins the dead head

    def _remove_namespace(self) -> None:
        pids = subprocess.run(
            ["ip", "netns", "pids", self.namespace], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:  # Ray's workers that outlived their raylet
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
        # A run killed before the veth moved into the namespace leaves the pair here.
        subprocess.run(["ip", "link", "del", f"{self.namespace[:10]}-a"], capture_output=True)


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]
