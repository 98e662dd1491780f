"""The integration tests' server launcher never runs them against a server it did not start."""

from __future__ import annotations

import socket

import pytest

from omni_serve.testing.serve_process import ServeProcess


def test_a_port_already_in_use_is_refused_before_anything_starts():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        server = ServeProcess("graphs.qwen3_omni:app", f"http://127.0.0.1:{port}")
        with pytest.raises(RuntimeError, match=rf"127.0.0.1:{port} is already in use"):
            server.launch(port_free_within_s=1.0)
        assert server.proc is None  # no serve run was started
