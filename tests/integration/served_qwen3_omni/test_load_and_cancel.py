"""User story: concurrent requests batch and complete, /metrics says where the payloads went and
what the encoder cache saved, and a client that leaves or a deadline that passes stops the work
in every stage."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from omni_serve.testing.served_metrics import (
    STOP_WITHIN_S,
    fresh_metrics,
    metric,
    stages_idle_within,
)
from tests.integration.served_qwen3_omni import URL, chat_body

pytestmark = pytest.mark.integration


def test_eight_concurrent_requests_complete_and_batch(served):
    """8 concurrent speech requests all finish, and the Talker decodes them together."""

    def one(i: int) -> httpx.Response:
        return httpx.post(f"{URL}/v1/chat/completions", json=chat_body(seed=i), timeout=300)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, range(8)))
    assert [r.status_code for r in responses] == [200] * 8
    for r in responses:
        assert r.json()["choices"][0]["message"]["audio"]["data"]
    metrics = fresh_metrics(URL, ("talker",))
    talker_batch = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('omni_stage_max_batch_size{stage="talker"}')
    )
    assert talker_batch > 1, [r.json()["timings"] for r in responses]  # did they overlap?
    assert "omni_stage_latency_seconds_bucket" in metrics
    assert "omni_audio_seconds_total" in metrics
    assert metric(metrics, "omni_audio_real_time_factor_count") >= 8
    assert metric(metrics, 'omni_stage_latency_seconds_count{stage="first_frame"}') >= 8


def test_metrics_say_which_backend_each_stages_payloads_came_by(served):
    """An operator reads on /metrics that a spoken reply's audio reached the ingress through
    shared memory (one host), out of the Code2wav replica's pool, with nothing overflowing."""
    shared = 'omni_channel_taken_payloads{backend="shared_memory",stage="ingress"}'
    before = httpx.get(f"{URL}/metrics", timeout=30).text
    r = httpx.post(f"{URL}/v1/chat/completions", json=chat_body(), timeout=300)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["audio"]["data"]
    after = httpx.get(f"{URL}/metrics", timeout=30).text
    had = metric(before, shared) if shared in before else 0.0
    assert metric(after, shared) > had, after
    assert metric(after, 'omni_channel_pool_bytes{stage="code2wav"}') > 0
    assert 'omni_channel_pool_bytes{stage="thinker"}' in after  # its engine's worker asked too
    overflowed = [line for line in after.splitlines() if line.startswith("omni_channel_overflowed")]
    assert overflowed and all(float(line.split()[-1]) == 0 for line in overflowed), overflowed


def test_a_conversation_resending_its_clip_gets_it_encoded_once(served):
    """A voice chat's next turn resends the first turn's clip with a new one: the encoder
    stage encodes only the new clip (its item cache counts one hit and one miss)."""
    from omni_serve.testing.media import wav_b64
    from tests.reference import sample_audio

    first, second = sample_audio()[:12000], sample_audio()[4000:] * 0.5
    hits = 'omni_encoder_item_cache{field="hits",stage="encoder"}'
    misses = 'omni_encoder_item_cache{field="misses",stage="encoder"}'

    def clip(samples) -> dict:
        return {"type": "input_audio", "input_audio": {"data": wav_b64(samples, 16000)}}

    def ask(messages: list[dict]) -> dict:
        body = {"model": "qwen3-omni", "messages": messages, "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    turn = [{"role": "user", "content": [clip(first)]}]
    answer = ask(turn)["choices"][0]["message"]["content"]
    before = httpx.get(f"{URL}/metrics", timeout=30).text
    turn += [{"role": "assistant", "content": answer}, {"role": "user", "content": [clip(second)]}]
    assert "encoder_s" in ask(turn)["timings"]  # the audio went by the encoder stage
    after = httpx.get(f"{URL}/metrics", timeout=30).text
    assert metric(after, hits) - metric(before, hits) == 1
    assert metric(after, misses) - metric(before, misses) == 1


def test_client_disconnect_stops_work_in_every_stage(served):
    """A streaming client that goes away mid-answer: the Talker and Thinker stop soon after."""
    body = chat_body(max_tokens=200)
    body["stage_overrides"]["talker"]["max_tokens"] = 500
    whole = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=300).json()
    # The client hangs up at the first audio: the work left after it must outlast the window
    # below, so that a stage still busy would show (a machine-speed-free precondition).
    left = whole["timings"]["total_s"] - whole["timings"]["first_audio_s"]
    assert left > STOP_WITHIN_S + 0.5, whole["timings"]
    body["stream"] = True
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            seen += '"audio"' in line
            if seen >= 1:
                break  # first audio arrived: hang up
    assert stages_idle_within(URL)
    assert httpx.get(f"{URL}/health", timeout=30).status_code == 200


def test_a_request_past_its_deadline_gets_a_504_and_stops_every_stage(served):
    """A request whose timeout_s is shorter than its answer: 504 / an in-band timeout error,
    and no stage keeps working on it (the same request takes > 3 s without the deadline)."""
    body = chat_body(max_tokens=200)
    body["stage_overrides"]["talker"]["max_tokens"] = 500
    body["timeout_s"] = 1.0
    start = time.monotonic()
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout_error"
    assert "1 s deadline" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3
    assert stages_idle_within(URL)
    body["stream"] = True
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"timeout_error"' in lines[-2]
    assert stages_idle_within(URL)
    assert (
        httpx.post(
            f"{URL}/v1/chat/completions", json={**body, "timeout_s": -1}, timeout=30
        ).status_code
        == 400
    )
