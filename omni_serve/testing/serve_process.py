"""Start ``serve run`` the way a user does, and stop it cleanly (SIGINT, then wait).

Used by the integration tests and the load tests.

A background process started by a non-interactive shell ignores SIGINT, so the child restores
the default handler before exec (CPU_STACK.md, Ray 2.60).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from omni_serve.config.kv_store import DISK_PATH_ENV

REPO = Path(__file__).parents[2]  # the repo root (editable install)


def _pids_titled(title: str) -> set[int]:
    ps = ["ps", "-ww", "-eo", "pid=,args="]  # -ww: whole lines, whatever COLUMNS says
    out = subprocess.run(ps, capture_output=True, text=True).stdout
    pattern = re.compile(rf"^\s*(\d+) ray::{title}(\.|\s|$)")
    return {int(m.group(1)) for line in out.splitlines() if (m := pattern.match(line))}


def replica_pids(deployment: str) -> set[int]:
    """PIDs of the Serve replica processes of one deployment, by Ray's process title
    (``ray::ServeReplica:<app>:<deployment>``), for tests that kill replicas."""
    return _pids_titled(rf"ServeReplica:[^:]+:{deployment}")


def actor_pids(actor_class: str) -> set[int]:
    """PIDs of the Ray actors of one class (``ray::<class>``, ``ray::<class>.<method>`` while
    busy), e.g. a replica's parallel DiT workers."""
    return _pids_titled(actor_class)


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


class ServeProcess:
    def __init__(
        self,
        target: str,
        base_url: str = "http://127.0.0.1:8000",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.target = target
        self.args = args  # builder arguments, key=value
        self.env = env or {}  # on top of this process's environment
        self.base_url = base_url
        self.proc: subprocess.Popen | None = None
        self.log_path = REPO / ".serve_run.log"
        # Each server gets a KV disk tier of its own: pages another run left (same tiny
        # model, same namespace) would make a test's first turn a cache hit.
        self.kv_pages = tempfile.TemporaryDirectory(prefix="omni-kv-pages-")

    def __enter__(self) -> ServeProcess:
        """``with ServeProcess(...) as server``: started (ready) inside, stopped after."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 240.0) -> None:
        """Launch, and return once the app answers /health with 200."""
        self.launch()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve run exited early:\n{self.tail()}")
            if self._answers():
                return
            time.sleep(2)
        self.stop()
        raise TimeoutError(f"serve run not ready in {timeout_s}s:\n{self.tail()}")

    def launch(self, port_free_within_s: float = 30.0) -> None:
        """Start ``serve run`` without waiting for it (tests of apps that never get ready).
        Refuses while another server holds the port: ``start`` would take its /health for
        this app's, and the tests would run against whatever that server runs. Waits a while
        first for a server just stopped, whose proxy may still be going away."""
        url = httpx.URL(self.base_url)
        deadline = time.monotonic() + port_free_within_s
        while _listening(url.host, url.port or 80):
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{url.host}:{url.port} is already in use (a `serve run` left running?); "
                    "stop that server first"
                )
            time.sleep(0.5)
        env = {
            **os.environ,
            "RAY_ADDRESS": "local",
            "RAY_AUTH_MODE": "disabled",
            DISK_PATH_ENV: self.kv_pages.name,
            **self.env,
        }
        self.log_path.parent.mkdir(exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        serve_bin = Path(sys.executable).parent / "serve"
        self.proc = subprocess.Popen(
            [str(serve_bin), "run", self.target, *self.args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_restore_sigint,
        )

    def _answers(self) -> bool:
        """Ready when /health is 200: the ingress is up and every stage's ``ready()`` answers."""
        try:
            r = httpx.get(f"{self.base_url}/health", timeout=30)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
