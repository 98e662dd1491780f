"""User story: `serve run configs/qwen3_omni.yaml` (the Serve config form, also what
`serve deploy` takes) serves the same API as the import-path form."""

from __future__ import annotations

import httpx
import pytest

from omni_serve.testing.serve_process import ServeProcess

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"


def test_serve_config_yaml_serves_chat():
    server = ServeProcess("configs/qwen3_omni.yaml", URL)
    server.start()
    try:
        r = httpx.post(
            f"{URL}/v1/chat/completions",
            json={"model": "qwen3-omni", "messages": [{"role": "user", "content": "Hi"}],
                  "max_tokens": 4, "modalities": ["text", "audio"],
                  "audio": {"voice": "ethan", "format": "flac"},
                  "stage_overrides": {"talker": {"max_tokens": 20}}},
            timeout=120,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["audio"]["data"]
        assert httpx.get(f"{URL}/health", timeout=30).status_code == 200
    finally:
        server.stop()
