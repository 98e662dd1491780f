"""Another process to put and take payloads in, driven over a pipe: a stage on another replica."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch


class Peer:
    def __init__(self, main: Callable[[Connection, dict[str, str]], None], **env: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=main, args=(child, env), daemon=True)
        # The child starts with ``env`` in place: importing ``main``'s module may read it
        # (CUDA_VISIBLE_DEVICES counts from the first CUDA query, a skipif at import time).
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            self.process.start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def __call__(self, op: str, arg=None):
        self.conn.send((op, arg))
        if not self.conn.poll(60):
            raise TimeoutError(f"peer did not answer {op}")
        answer = self.conn.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def wait_in_use(self, expected: int, timeout: float = 3.0) -> int:
        deadline = time.monotonic() + timeout
        while (count := self("in_use")) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return count

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(("exit", None))
            self.process.join(10)


def serve_ops(conn: Connection, ops: dict[str, Callable[[Any], Any]]) -> None:
    """A peer's loop: answers each ``(op, arg)`` with ``ops[op](arg)``, or with the exception
    it raised (so the test sees the message), until "exit"."""
    while True:
        op, arg = conn.recv()
        if op == "exit":
            return
        try:
            conn.send(ops[op](arg))
        except Exception as exc:
            conn.send(exc)


def channel_ops(channel: Any) -> dict[str, Callable[[Any], Any]]:
    """A peer's ops on its channel, for ``serve_ops``: what a stage does with refs."""
    import asyncio

    from omni_serve.transport import take

    return {
        "put": channel.put,
        "take": lambda ref: asyncio.run(take(ref)),
        "get": lambda ref: asyncio.run(channel.get(ref)),
        "abandon": channel.abandon,
    }


def buffers_in_use(_: Any = None) -> int:
    """How many of this process's direct-backend buffers are in use (not yet handed back)."""
    from omni_serve.transport import direct_endpoint as direct

    owner = direct.endpoint()
    return sum(buffer.state == direct.IN_USE for buffer in owner.buffers.values())


def mixed_payload(side: int = 512, fill: float = 1.0) -> dict[str, torch.Tensor]:
    """A dict payload with what a backend must get right: a non-contiguous view, bf16 and an
    empty tensor."""
    base = torch.randn(side, 2 * side, generator=torch.Generator().manual_seed(0)) * fill
    return {"rows": base.t(), "bf16": base[:3].to(torch.bfloat16), "empty": torch.empty(0, 8)}


def assert_same_payload(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for key, t in want.items():
        assert got[key].dtype == t.dtype and torch.equal(got[key], t), key
