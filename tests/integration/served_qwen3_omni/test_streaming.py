"""User story: served replies equal transformers' and stream as they are made: a streamed reply
concatenates to the whole one, the openai client streams it, and /health names every stage."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.integration.served_qwen3_omni import URL, chat_body
from tests.reference import request_parts

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["text", "audio", "image", "mixed", "video", "video_audio"])
def test_served_text_and_audio_equal_transformers(served, reference_runs, omni_processor, kind):
    """Greedy through the whole graph == transformers' generate: same text, same waveform
    (video_audio: a video the model hears too, its sound track interleaved with its frames)."""
    from tests.reference import TALKER_MAX_TOKENS, THINKER_MAX_TOKENS

    ref = reference_runs[kind]
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": request_parts(kind)}],
        "max_tokens": THINKER_MAX_TOKENS,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "stage_overrides": {"talker": {"temperature": 0, "max_tokens": TALKER_MAX_TOKENS}},
        "use_audio_in_video": kind == "video_audio",
    }
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    # audio alone, or images and videos without audio, are encoded by the encoder stage, then
    # fed to vLLM as embeddings; a mix with audio is encoded by the Thinker's vLLM
    assert ("encoder_s" in r.json()["timings"]) == (kind in ("audio", "image", "video"))
    expected_text = omni_processor.tokenizer.decode(ref.generated, skip_special_tokens=True)
    # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 sequence, which
    # transformers' one-shot decode renders as U+FFFD; the tokens themselves are identical.
    assert message["content"] == expected_text.rstrip("\ufffd")
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])))
    assert rate == 24000
    expected = ref.waveform.numpy()
    assert samples.shape == expected.shape
    assert abs(samples - expected).max() <= 1e-4 + 1 / 32767  # 16-bit WAV quantisation


def test_media_the_thinker_encodes_leave_no_shared_memory_in_use(served):
    """User story: prompts mixing audio and an image (the Thinker encodes those itself) send
    their media over shared memory (1.5 s of audio and an image: 114 KB, past the inline
    size), and every segment is handed back once the replies are out."""
    from omni_serve.testing.abuse import wait_for
    from omni_serve.testing.leaks import shm_usage

    messages = [{"role": "user", "content": request_parts("mixed")}]
    body = {"model": "qwen3-omni", "messages": messages, "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120).status_code == 200
    time.sleep(1)  # its consumers hand back what they read
    before = shm_usage()  # other edges' last payloads may still be held by their consumers
    for _ in range(4):
        r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
    after = wait_for(
        lambda: (u := shm_usage()).in_use <= before.in_use and u,
        10,
        "the media segments handed back",
    )
    assert after.segments == before.segments  # one after another: the same segment reused


def test_streaming_concatenates_to_the_non_streamed_response(served):
    """SSE: text deltas and audio deltas join up to exactly the non-streamed answer."""
    whole = httpx.post(f"{URL}/v1/chat/completions", json=chat_body(), timeout=120).json()
    whole_audio, _ = sf.read(
        io.BytesIO(base64.b64decode(whole["choices"][0]["message"]["audio"]["data"]))
    )
    body = chat_body(stream=True, stream_options={"include_usage": True})
    events = []
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    audio_bytes = b"".join(
        base64.b64decode(c["choices"][0]["delta"]["audio"]["data"])
        for c in chunks
        if c["choices"] and "audio" in c["choices"][0]["delta"]
    )
    assert text == whole["choices"][0]["message"]["content"]
    streamed, rate = sf.read(io.BytesIO(audio_bytes))
    assert rate == 24000 and np.array_equal(streamed, whole_audio)  # every sample
    audio_chunks = [c for c in chunks if c["choices"] and "audio" in c["choices"][0]["delta"]]
    assert len(audio_chunks) > 1  # audio arrives in pieces, the first one small
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1
    timings = finish[0]["timings"]  # a streaming client's per-request timing
    assert 0 < timings["first_audio_s"] <= timings["total_s"]
    assert timings["first_frame_s"] <= timings["last_frame_s"] <= timings["total_s"]
    assert timings["rtf"] == pytest.approx(timings["total_s"] / (len(streamed) / 24000))


def test_a_talker_that_ends_before_the_text_leaves_the_reply_whole(served):
    """User story: a client caps the speech (the Talker's max_tokens) below what the reply's
    text takes; the text still arrives whole with the audio made, streamed or not (feeding the
    ended Talker was a 500, or an error event mid-stream)."""
    talker = {"temperature": 0, "max_tokens": 2}
    body = chat_body(max_tokens=24, stage_overrides={"talker": talker})
    whole = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    assert answer["usage"]["completion_tokens"] == 24  # the text outlasted the Talker
    audio, rate = sf.read(
        io.BytesIO(base64.b64decode(answer["choices"][0]["message"]["audio"]["data"]))
    )
    assert rate == 24000 and 0 < len(audio) < 2 * 1920  # one frame's worth, at most two
    events = []
    with httpx.stream(
        "POST", f"{URL}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == answer["choices"][0]["message"]["content"]


def test_openai_client_streams(client):
    ask = dict(model="qwen3-omni", messages=[{"role": "user", "content": "Hi"}], max_tokens=12)
    whole = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streaming_rejects_unstreamable_audio_formats(served):
    body = chat_body(stream=True, audio={"voice": "ethan", "format": "mp3"})
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "streamed audio" in r.json()["error"]["message"]


def test_health_reports_every_stage(served):
    r = httpx.get(f"{URL}/health", timeout=30)
    assert r.status_code == 200
    assert r.json()["stages"] == ["code2wav", "encoder", "talker", "thinker"]
