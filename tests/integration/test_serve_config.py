"""User stories of serving a pipeline config of one's own: a stage that cannot start says why;
a text-only pipeline answers in text and refuses audio output; and its conversations resume
from the KV store's disk tier after the app restarts. (The Serve config YAML form, what
`serve deploy` takes, is served by tests/integration/test_served_qwen2_5_omni.py.)

The text-only stories share one app (``text_app``), which the restart story stops: it runs
last. Each `serve run` costs about a minute of CI's 2 cores."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import REPO, ServeProcess

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
TEXT_PIPELINE = "pipeline_config=configs/pipelines/qwen3_omni_text_tiny.yaml"


def test_a_stage_that_cannot_start_shows_why_on_health_and_serve_run_fails(tmp_path):
    """User story: an operator mistypes a vLLM engine argument; /health says which stage is
    down and vLLM's reason, and `serve run` exits naming the stage instead of hanging."""
    config = (REPO / "configs/pipelines/qwen3_omni_text_tiny.yaml").read_text()
    good = "args: {max_model_len: 4096}"
    broken = config.replace(good, good[:-1] + ", kv_cache_dtype: bogus}")
    assert broken != config
    (tmp_path / "broken.yaml").write_text(broken)
    server = ServeProcess(
        "graphs.qwen3_omni:build_app", URL, args=(f"pipeline_config={tmp_path / 'broken.yaml'}",)
    )
    server.launch()
    try:
        health = wait_for(
            lambda: (r := _health()) is not None and "thinker" in r.get("reasons", {}) and r,
            180,
            "/health gives the Thinker's reason",
        )
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


@pytest.fixture(scope="module")
def text_app():
    """The shipped text-only pipeline, served; the restart story stops it."""
    with ServeProcess("graphs.qwen3_omni:build_app", URL, args=(TEXT_PIPELINE,)) as server:
        yield server


def test_a_text_only_pipeline_answers_in_text_and_refuses_audio_output(
    text_app, reference_runs, omni_processor
):
    """User story: an operator serves a checkpoint without a Talker (Qwen3-Omni's Thinking and
    Captioner ones) with the text-only pipeline config: a chat about a clip gets transformers'
    text, and asking for speech is a 400 that says why."""
    from tests.reference import THINKER_MAX_TOKENS, request_parts

    chat = {
        "model": "qwen3-omni",
        "max_tokens": THINKER_MAX_TOKENS,
        "temperature": 0,
        "messages": [{"role": "user", "content": request_parts("audio")}],
    }
    r = httpx.post(f"{URL}/v1/chat/completions", json=chat, timeout=120)
    assert r.status_code == 200, r.text
    expected = omni_processor.tokenizer.decode(
        reference_runs["audio"].generated, skip_special_tokens=True
    )
    assert r.json()["choices"][0]["message"]["content"] == expected.rstrip("\ufffd")
    assert "encoder_s" in r.json()["timings"]
    spoken = {**chat, "modalities": ["text", "audio"], "audio": {"voice": "ethan"}}
    for path, body in (
        ("chat/completions", spoken),
        ("audio/speech", {"model": "qwen3-omni", "input": "Hi"}),
    ):
        refused = httpx.post(f"{URL}/v1/{path}", json=body, timeout=60)
        assert refused.status_code == 400, refused.text
        assert "answers in text only" in refused.json()["error"]["message"]
    earlier = {"role": "assistant", "audio": {"id": "audio-1"}}
    named = {**chat, "messages": [*chat["messages"], earlier, {"role": "user", "content": "?"}]}
    refused = httpx.post(f"{URL}/v1/chat/completions", json=named, timeout=60).json()
    assert refused["error"]["param"] == "messages[1].audio.id"
    assert "this deployment makes no spoken replies" in refused["error"]["message"]
    health = httpx.get(f"{URL}/health", timeout=30).json()
    assert health == {"status": "ok", "stages": ["encoder", "thinker"]}
    with connect("ws://127.0.0.1:8000/v1/audio/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "chat", "messages": chat["messages"]}))
        events = [json.loads(ws.recv(timeout=60))]
        while events[-1]["type"] not in ("response.done", "error"):
            events.append(json.loads(ws.recv(timeout=60)))  # a PCM frame would not parse
    kinds = {e["type"] for e in events}
    assert kinds <= {"response.created", "response.text.delta", "response.done"}, events
    assert events[-1]["type"] == "response.done" and events[-1]["usage"]["completion_tokens"]
    clip = base64.b64decode(request_parts("audio")[0]["input_audio"]["data"])
    heard = httpx.post(
        f"{URL}/v1/audio/transcriptions",
        timeout=60,
        files={"file": ("clip.wav", clip)},
        data={"model": "qwen3-omni", "max_completion_tokens": 4},
    )
    assert heard.status_code == 200 and heard.json()["usage"]["output_tokens"] == 4, heard.text


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


def test_a_conversation_resumes_from_disk_after_the_app_restarts(text_app):
    """User story: an operator stops the app (a deploy, a node drained) and starts it again; a
    conversation's next turn resumes from the KV prefix the stopped store held only in memory,
    because a store that stops writes its memory to the disk tier first."""
    system = {"role": "system", "content": "You plan trips through the Alps by train. " * 40}
    turn = [system, {"role": "user", "content": "Which pass is the prettiest?"}]
    reply = _chat(turn)["choices"][0]["message"]["content"]
    kept = 'omni_session_kv{tier="host",what="prefixes"}'
    wait_for(lambda: _series(kept) == 1, 30, "the turn's prefix is kept in memory")
    assert _series('omni_session_kv{tier="disk",what="prefixes"}') == 0
    text_app.stop()
    pages = list(Path(text_app.kv_pages.name).rglob("*.kvpage"))
    assert len(pages) == 1, "the stopping store wrote its one prefix to disk"
    second = ServeProcess("graphs.qwen3_omni:build_app", URL, (TEXT_PIPELINE,))
    second.kv_pages = text_app.kv_pages  # the same disk, as on a restarted node
    with second:
        turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        usage = _chat(turn)["usage"]
        assert _series('omni_session_kv{tier="disk",what="hits"}') == 1
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
