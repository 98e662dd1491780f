"""User story: an operator serves Qwen3-Omni; fuzzed and idle clients cannot break it, and when
a replica of any stage dies, clients get a whole answer or a clear error naming the stage, never
a hang, while Serve replaces the replica and the app serves on without a restart; stopping it
leaves no shared memory behind.

One app (the tiny graph from tests/integration/pipelines/qwen3_omni_ops.yaml) serves every test
here. The Code2wav kill is in served_qwen3_omni/test_replica_death.py.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from omni_serve.testing.abuse import fuzz_without_server_errors, send_while_killing, wait_for
from omni_serve.testing.ray_metrics import QUICK_REPORTS, ray_export, steady
from omni_serve.testing.serve_process import ServeProcess, replica_pids
from tests.integration.served_processes import (
    gone_within,
    shm_files_mapped,
    the_thinker_and_its_engine,
)

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
WS_URL = "ws://127.0.0.1:8000/v1/audio/stream"
MODEL = {"model": "qwen3-omni"}
SPOKEN = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}


@pytest.fixture(scope="module")
def served():
    config = "pipeline_config=tests/integration/pipelines/qwen3_omni_ops.yaml"
    app = ServeProcess("graphs.qwen3_omni:build_app", URL, args=(config,), env=QUICK_REPORTS)
    with app as server:
        yield server


def chat(body: dict, timeout: float = 240) -> httpx.Response:
    return httpx.post(f"{URL}/v1/chat/completions", json={**MODEL, **body}, timeout=timeout)


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def healthy_again(stage: str, old_pid: int) -> None:
    """/health turns 200 again and the stage runs on a new process."""
    wait_for(
        lambda: httpx.get(f"{URL}/health", timeout=30).status_code == 200,
        120,
        f"the {stage} is replaced and /health is 200 again",
    )
    assert replica_pids(stage) - {old_pid}, f"Serve did not replace the {stage} replica"


def test_fuzzed_requests_never_get_a_server_error(served):
    """Requests built from the app's OpenAPI spec (chat, speech, models, health, metrics) get
    no 5xx beyond backpressure/deadlines; the model name is fixed so most reach the stages."""
    paths = fuzz_without_server_errors(URL, body_fields=MODEL)
    assert paths >= {"/v1/chat/completions", "/v1/audio/speech"}


async def test_idle_websocket_clients_are_closed_and_do_not_lock_others_out(served):
    """Twenty clients open the audio WebSocket and send nothing (slowloris-style): a working
    client on another socket and plain HTTP requests are served meanwhile, and after the 2 s
    idle timeout each idle client gets an idle_timeout error event and a normal close."""
    import websockets

    idle = [await websockets.connect(WS_URL) for _ in range(20)]
    async with websockets.connect(WS_URL, max_size=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "speech",
                    "input": "Hello there.",
                    "stage_overrides": {"talker": {"max_tokens": 20}},
                }
            )
        )
        while not isinstance(frame := await ws.recv(), str) or json.loads(frame)["type"] not in (
            "response.done",
            "error",
        ):
            pass
        assert json.loads(frame)["type"] == "response.done", frame
    reply = await asyncio.to_thread(chat, ask("Hi", max_tokens=4))
    assert reply.status_code == 200
    for ws in idle:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 10)


def test_the_playground_switched_off_is_a_404_that_names_the_switch(served):
    for path in ("/", "/playground/playground.js", "/playground/config.json"):
        response = httpx.get(f"{URL}{path}", timeout=30)
        assert response.status_code == 404, path
        assert "api.playground" in response.json()["error"]["message"]


def test_a_sessions_prefix_is_kept_for_the_app_not_per_ingress_replica(served):
    """With two ingress replicas, Serve's proxy sends a session's turns to either: the prefix
    turn one exported is in the app's session store, which /metrics on every ingress replica
    shows (ten asks: each replica answers some), and turn two takes it and leaves its own."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    session = {"session_id": "ops-session-1"}
    turn = [system, {"role": "user", "content": "Name a colour."}]
    first = chat({"messages": turn, "max_tokens": 4, **session})
    assert first.status_code == 200, first.text[:300]
    assert [kept_prefixes() for _ in range(10)] == [1] * 10
    turn += [
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And another?"},
    ]
    second = chat({"messages": turn, "max_tokens": 4, **session})
    assert second.status_code == 200, second.text[:300]
    prompt = first.json()["usage"]["prompt_tokens"]
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt // 128 * 128
    assert [kept_prefixes() for _ in range(4)] == [1] * 4  # turn two's replaced turn one's
    assert kv_store_series("disk", "hits") == 1  # turn one's, from its page (memory keeps none)
    assert kv_store_series("disk", "bytes") > 0


def test_a_voice_chats_next_spoken_turn_is_served_from_the_first_ones_cache(served):
    """User story: a voice chat (audio in, speech out, one session): the second spoken turn
    reuses turn one's KV and the rows turn one kept for the Talker (cached tokens reported),
    and still speaks."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    session = {"session_id": "ops-voice-1", **SPOKEN, "max_tokens": 4}
    asked = audio_question()["messages"]  # the audio goes through the encoder stage
    first = chat({"messages": [system, *asked], **session})
    assert first.status_code == 200, first.text[:300]
    reply = first.json()["choices"][0]["message"]
    assert reply["audio"]["data"]
    turn = [system, *asked, {"role": "assistant", "content": reply["content"]}, *asked]
    second = chat({"messages": turn, **session})
    assert second.status_code == 200, second.text[:300]
    assert second.json()["choices"][0]["message"]["audio"]["data"]
    prompt = first.json()["usage"]["prompt_tokens"]
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt // 128 * 128 > 0


def test_a_new_session_that_starts_like_a_kept_one_is_handed_its_prefix(served):
    """User story: two callers of a voice agent send its system prompt and the same greeting
    clip; the second caller's first turn is handed the first caller's kept prefix (found by
    its content, from the disk tier), and answers; a caller with another system prompt is
    not."""
    system = {"role": "system", "content": "You are the front desk of a small hotel. " * 30}
    greeting = audio_question()["messages"]
    hits, misses = kv_store_series("disk", "hits"), kv_store_series("all", "misses")
    first = chat({"messages": [system, *greeting], "max_tokens": 4, "session_id": "ops-caller-a"})
    assert first.status_code == 200, first.text[:300]
    assert kv_store_series("all", "misses") == misses + 1  # nothing kept starts like it
    asked = [system, *greeting, {"role": "user", "content": "Is breakfast included?"}]
    second = chat({"messages": asked, "max_tokens": 4, "session_id": "ops-caller-b"})
    assert second.status_code == 200, second.text[:300]
    assert kv_store_series("disk", "hits") == hits + 1
    other = {"role": "system", "content": "You are a ferry timetable. " * 30}
    third = chat({"messages": [other, *greeting], "max_tokens": 4, "session_id": "ops-caller-c"})
    assert third.status_code == 200, third.text[:300]
    assert kv_store_series("disk", "hits") == hits + 1
    assert kv_store_series("all", "misses") == misses + 2


def test_a_damaged_page_on_disk_is_refused_and_its_turn_answers_as_a_cold_one(served):
    """User story: a conversation's KV page on disk is damaged (a bad sector, a half-copied
    backup); its next turn does not load it, computes its prompt instead, and answers as a
    request that never had a prefix does."""
    system = {"role": "system", "content": "You answer questions about trains. " * 30}
    turn = [system, {"role": "user", "content": "When is the first train?"}]
    greedy = {"max_tokens": 4, "temperature": 0}
    pages = Path(served.kv_pages.name)
    before = set(pages.rglob("*.kvpage"))
    first = chat({"messages": turn, **greedy, "session_id": "ops-damaged"})
    assert first.status_code == 200, first.text[:300]
    wait_for(lambda: set(pages.rglob("*.kvpage")) - before, 30, "the turn's page is written")
    (page,) = set(pages.rglob("*.kvpage")) - before
    data = bytearray(page.read_bytes())
    data[-64:] = bytes(b ^ 0xFF for b in data[-64:])  # the last layer's blocks, not the header
    page.write_bytes(bytes(data))
    refused, hits = kv_store_series("disk", "refused"), kv_store_series("disk", "hits")
    reply = first.json()["choices"][0]["message"]["content"]
    turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    second = chat({"messages": turn, **greedy, "session_id": "ops-damaged"})
    assert second.status_code == 200, second.text[:300]
    assert kv_store_series("disk", "refused") == refused + 1
    assert kv_store_series("disk", "hits") == hits
    cold = chat({"messages": turn, **greedy})  # no session: the store is never asked
    assert cold.status_code == 200, cold.text[:300]
    said = second.json()["choices"][0]["message"]["content"]
    assert said == cold.json()["choices"][0]["message"]["content"]


def kv_store_series(tier: str, what: str) -> float:
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    series = f'omni_session_kv{{tier="{tier}",what="{what}"}}'
    [line] = [line for line in lines if line.startswith(series)]
    return float(line.split()[-1])


def kept_prefixes() -> float:
    return kv_store_series("all", "prefixes")


def test_a_thinker_killed_mid_stream_ends_it_with_an_error_naming_the_thinker(served):
    """The client has part of the text when the Thinker dies: the stream ends with an error
    event saying the Thinker died (and to send again) and [DONE], at once, not after a hang.
    Its engine's processes die with it and leave their queues in /dev/shm (vLLM removes them
    only when it stops cleanly): the replacement's engine removes them (it sweeps as it starts,
    and every 30 s: the dead engine's processes can outlive their replica for a while)."""
    for attempt in range(2):
        pid, engine = the_thinker_and_its_engine(served)
        queues = {q for q in shm_files_mapped(engine) if "/psm_" in q}
        assert queues  # else there is nothing to check
        events, took = stream_killing_the_thinker(pid)
        assert events[-1] == "[DONE]" and took < 30
        last = json.loads(events[-2])
        if "error" in last or attempt:
            break
        # The Thinker had made all 256 tokens before the kill landed (a busy ingress can
        # stream behind it): not a kill mid-stream. Once Serve replaces it, kill the next one.
        healthy_again("thinker", pid)
    error = last["error"]
    assert (
        "stage 'thinker' died" in error["message"]
        and "send the request again" in (error["message"])
    )
    healthy_again("thinker", pid)
    assert chat(ask("Hi again", max_tokens=4)).status_code == 200
    gone_within(queues, 90)  # the dead engine can outlive its replica; sweeps every 30 s
    said = "files killed vLLM engines left in /dev/shm"  # Ray forwards replica logs late
    wait_for(lambda: said in served.tail(400_000), 30, "the sweep's log line")


def stream_killing_the_thinker(pid: int) -> tuple[list[str], float]:
    """A streamed reply's SSE data lines, the Thinker (``pid``) killed once the client has two
    text deltas; and the seconds the stream took."""
    # Greedy: this prompt runs all 256 tokens. Sampled, a quarter of runs drew <|im_end|>
    # within 12-117 tokens here (tiny vocabulary), and a reply done before the kill has no error.
    body = {**MODEL, **ask("Tell a long story.", max_tokens=256, temperature=0, stream=True)}
    events = []
    began = time.monotonic()
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 3:  # the role chunk and two text deltas
                os.kill(pid, signal.SIGKILL)
    return events, time.monotonic() - began


def test_a_talker_killed_mid_request_is_rerun_and_the_client_gets_the_whole_answer(served):
    """A non-streamed spoken reply: the client has seen nothing when the Talker dies a second
    in, so the request runs again once the replacement is up and the client gets its whole
    reply, the same as an undisturbed run (greedy, seeded)."""
    body = ask(
        "Tell a story.",
        max_tokens=16,
        **SPOKEN,
        stage_overrides={"talker": {"max_tokens": 200, "seed": 3}},
    )
    undisturbed = chat(body).json()
    [pid] = replica_pids("talker")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(chat, body)
        time.sleep(1.0)  # the reply takes ~2.5 s: the Talker is mid-request
        os.kill(pid, signal.SIGKILL)
        response = reply.result(timeout=300)
    assert response.status_code == 200, response.text[:500]
    message = response.json()["choices"][0]["message"]
    assert message["content"] == undisturbed["choices"][0]["message"]["content"]
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])))
    expected, _ = sf.read(
        io.BytesIO(base64.b64decode(undisturbed["choices"][0]["message"]["audio"]["data"]))
    )
    assert rate == 24000 and len(samples) == len(expected) > 0
    healthy_again("talker", pid)


def audio_question() -> dict:
    """An audio-only prompt: the encoder stage encodes it (mixed prompts stay in the Thinker)."""
    from tests.reference import sample_audio

    buf = io.BytesIO()
    sf.write(buf, sample_audio(), 16000, format="WAV", subtype="FLOAT")
    sound = {"data": base64.b64encode(buf.getvalue()).decode(), "format": "wav"}
    content = [
        {"type": "input_audio", "input_audio": sound},
        {"type": "text", "text": "What do you hear?"},
    ]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4}


def test_the_ingress_sends_audio_to_the_encoder_by_its_pipeline_edge(served):
    """The ops pipeline pins ``ingress -> encoder`` to the object store (auto never picks it
    on one host): /metrics shows the encoder read the audio question from there."""
    pinned = 'omni_channel_taken_payloads{backend="object_store",stage="encoder"}'

    def read() -> float:
        lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith(pinned))

    before = read()
    assert chat(audio_question()).status_code == 200
    assert read() == before + 1


def test_rays_metrics_export_has_every_replicas_series_where_metrics_shows_one(served):
    """User story: an operator running two ingress replicas scrapes Ray's metrics export: each
    replica's series are there, tagged by deployment and replica, so that their sum counts
    every request, and every stage's replica reports its own gauges."""

    def ok_requests() -> float:
        return sum(
            v
            for labels, v in ray_export("ray_omni_requests_total")
            if labels["deployment"] == "ingress" and labels["status"] == "ok"
        )

    before = steady(ok_requests)  # earlier tests' requests reach the export a report late
    for i in range(6):  # the first one spoken: every stage has run, whatever ran before
        spoken = SPOKEN if i == 0 else {}
        assert chat(ask(f"Count to {i}.", max_tokens=2, **spoken)).status_code == 200
    wait_for(lambda: ok_requests() == before + 6, 90, "Ray's export counts all six requests")
    pools = ray_export("ray_omni_channel_pool_bytes")
    ingresses = {labels["replica"] for labels, _ in pools if labels["deployment"] == "ingress"}
    assert len(ingresses) == 2, pools
    stages = {labels["deployment"] for labels, _ in pools}
    assert stages >= {"ingress", "encoder", "thinker", "talker", "code2wav"}, stages
    assert all(labels["stage"] == labels["deployment"] for labels, _ in pools)


def test_a_killed_encoder_replica_is_replaced_while_audio_requests_keep_succeeding(served):
    """Two clients send audio questions for 10 s; the encoder is killed 2 s in. Calls that hit
    the dead replica are sent again and wait for the replacement: no request fails."""
    body = audio_question()
    [pid] = replica_pids("encoder")
    results = send_while_killing(lambda: chat(body), pid, 10)
    failed = [(r.status_code, r.text[:300]) for r in results if r.status_code != 200]
    assert len(results) > 4 and not failed, failed
    healthy_again("encoder", pid)


def test_a_crashed_vllm_engine_shows_on_health_and_its_replica_is_replaced(served):
    """vLLM's engine process dies under the Thinker (as an OOM kill would do it): the log says
    so, /health is 503 naming the Thinker, and a request sent meanwhile waits for the
    replacement replica and succeeds instead of failing with EngineDeadError. The queues the
    dead engine left in /dev/shm go when the replacement starts its engine."""
    pid, engine = the_thinker_and_its_engine(served)
    queues = {q for q in shm_files_mapped(engine) if "/psm_" in q}
    assert queues  # else there is nothing to check
    os.kill(engine, signal.SIGKILL)
    unhealthy = wait_for(
        lambda: (r := httpx.get(f"{URL}/health", timeout=10)).status_code == 503 and r,
        30,
        "/health reports the Thinker",
    )
    assert any(s.startswith("thinker:") for s in unhealthy.json()["stages"])
    assert chat(ask("Still there?", max_tokens=4)).status_code == 200
    assert "the Thinker's vLLM engine died" in served.tail(200_000)
    healthy_again("thinker", pid)
    gone_within(queues, 90)


def test_stopping_the_server_removes_its_shared_memory(served):
    """Ctrl-C on ``serve run`` stops every replica cleanly: the channel's segments of each stage
    (/dev/shm/omni-shm-<pid>-*) and the queues the Thinker's vLLM processes map (psm_*) go
    with them, instead of piling up run after run (Serve ends a replica without exit handlers).
    Last in this module: it stops the app."""
    # A spoken reply puts the Thinker's rows and Code2wav's audio on shared memory (the audio
    # question alone goes inline and by the object store: run alone, this found no segments).
    assert chat({**audio_question(), **SPOKEN}).status_code == 200
    _, engine = the_thinker_and_its_engine(served)
    queues = shm_files_mapped(engine)
    assert any("/psm_" in q for q in queues), queues  # else there is nothing to check
    segments = {
        str(path)
        for pid in replica_pids(r"[^\s.]+")
        for path in Path("/dev/shm").glob(f"omni-shm-{pid}-*")
    }
    assert segments  # the stages' pools
    served.stop()
    # The engine process unlinks its queues as it exits, which can trail `serve run`'s own
    # exit by a moment on a loaded machine: gone within seconds, not piling up.
    gone_within(queues | segments, 30)
