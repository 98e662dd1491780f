"""User story: when a replica of any stage dies, clients get a whole answer or a clear error
naming the stage, never a hang, while Serve replaces the replica and the app serves on without
a restart; every stage reports its metrics to Ray's export and reads its inputs by its pipeline
edge. The Code2wav kill is in served_qwen3_omni/test_replica_death.py."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import os
import signal
import time

import httpx
import pytest
import soundfile as sf

from omni_serve.testing.abuse import send_while_killing, wait_for
from omni_serve.testing.ray_metrics import ray_export, steady
from omni_serve.testing.serve_process import replica_pids
from tests.integration.operations_qwen3_omni.app import (
    MODEL,
    SPOKEN,
    URL,
    ask,
    audio_question,
    chat,
    healthy_again,
)
from tests.integration.served_processes import (
    gone_within,
    health_names,
    shm_files_mapped,
    the_thinker_and_its_engine,
)

pytestmark = pytest.mark.integration


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
    health_names(URL, "thinker")
    assert chat(ask("Still there?", max_tokens=4)).status_code == 200
    assert "the Thinker's vLLM engine died" in served.tail(200_000)
    healthy_again("thinker", pid)
    gone_within(queues, 90)
