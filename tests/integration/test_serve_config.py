"""User story: `serve run configs/qwen3_omni.yaml` (the Serve config form, also what
`serve deploy` takes) serves the same API as the import-path form."""

from __future__ import annotations

import httpx
import pytest

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import REPO, ServeProcess

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


def test_a_stage_that_cannot_start_shows_why_on_health_and_serve_run_fails(tmp_path):
    """User story: an operator mistypes a vLLM engine argument; /health says which stage is
    down and vLLM's reason, and `serve run` exits naming the stage instead of hanging."""
    config = (REPO / "configs/pipelines/qwen3_omni_tiny.yaml").read_text()
    good = "args: {max_model_len: 4096, max_num_seqs: 16}"
    broken = config.replace(good, good[:-1] + ", kv_cache_dtype: bogus}")
    assert broken != config
    (tmp_path / "broken.yaml").write_text(broken)
    server = ServeProcess("graphs.qwen3_omni:build_app", URL,
                          args=(f"pipeline_config={tmp_path / 'broken.yaml'}",))  # fmt: skip
    server.launch()
    try:
        health = wait_for(lambda: (r := _health()) is not None and "thinker" in r.get("reasons", {})
                          and r, 180, "/health gives the Thinker's reason")  # fmt: skip
        assert health["status"] == "unavailable"
        assert (
            "kv_cache_dtype" in health["reasons"]["thinker"]
            or "bogus" in (health["reasons"]["thinker"])
        )
        server.proc.wait(timeout=300)  # its exit status is 0 even so (Ray 2.60's serve run)
        assert "Failed to update the deployments ['thinker']" in server.tail(20_000)
    finally:
        server.stop()


def _health() -> dict | None:
    try:
        response = httpx.get(f"{URL}/health", timeout=10)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 503 else None
