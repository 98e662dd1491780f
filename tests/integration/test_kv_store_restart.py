"""User story: an operator stops the app (a deploy, a node drained) and starts it again; a
conversation's next turn resumes from the KV prefix the stopped store held only in memory,
because a store that stops writes its memory to the disk tier first."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import ServeProcess

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
PIPELINE = "pipeline_config=tests/integration/pipelines/qwen3_omni_text_sessions.yaml"


def _chat(messages: list[dict]) -> dict:
    body = {
        "model": "qwen3-omni",
        "messages": messages,
        "max_tokens": 4,
        "temperature": 0,
        "session_id": "restart-1",
    }
    reply = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=240)
    assert reply.status_code == 200, reply.text[:300]
    return reply.json()


def _series(name: str) -> float:
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    [line] = [line for line in lines if line.startswith(name)]
    return float(line.split()[-1])


def test_a_conversation_resumes_from_disk_after_the_app_restarts():
    system = {"role": "system", "content": "You plan trips through the Alps by train. " * 40}
    turn = [system, {"role": "user", "content": "Which pass is the prettiest?"}]
    first = ServeProcess("graphs.qwen3_omni:build_app", URL, (PIPELINE,))
    with first:
        reply = _chat(turn)["choices"][0]["message"]["content"]
        kept = 'omni_session_kv{tier="host",what="prefixes"}'
        wait_for(lambda: _series(kept) == 1, 30, "the turn's prefix is kept in memory")
        assert _series('omni_session_kv{tier="disk",what="prefixes"}') == 0
    pages = list(Path(first.kv_pages.name).rglob("*.kvpage"))
    assert len(pages) == 1, "the stopping store wrote its one prefix to disk"
    second = ServeProcess("graphs.qwen3_omni:build_app", URL, (PIPELINE,))
    second.kv_pages = first.kv_pages  # the same disk, as on a restarted node
    with second:
        turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        usage = _chat(turn)["usage"]
        assert _series('omni_session_kv{tier="disk",what="hits"}') == 1
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
