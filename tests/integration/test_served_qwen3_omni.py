"""User story: from the repo root, `serve run graphs.qwen3_omni:app` serves the tiny
Qwen3-Omni graph, and the official openai client gets text plus a 24 kHz WAV back."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import os
import signal
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from omni_serve.testing.serve_process import ServeProcess, replica_pids
from omni_serve.testing.served_metrics import metric, stages_idle_within
from tests.reference import request_parts

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def served():
    with ServeProcess("graphs.qwen3_omni:app", URL) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["qwen3-omni"]
    assert client.models.retrieve("qwen3-omni").id == "qwen3-omni"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"


def test_a_route_this_graph_lacks_is_a_404_naming_its_routes(served):
    """The image route on the speech graph: the error shape, with the routes there are."""
    r = httpx.post(f"{URL}/v1/images/generations", json={"prompt": "a fox"}, timeout=30)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert message.startswith("no route POST /v1/images/generations on this server")
    assert "POST /v1/chat/completions" in message and "POST /v1/audio/speech" in message


def test_chat_returns_text_and_wav_audio(client):
    response = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
    )
    message = response.choices[0].message
    assert message.content and response.usage.completion_tokens == 8
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)))
    assert rate == 24000 and len(samples) > 24000 // 2
    assert message.audio.transcript == message.content


def test_greedy_is_deterministic(client):
    ask = dict(model="qwen3-omni", messages=[{"role": "user", "content": "Hi"}], max_tokens=6)
    first = client.chat.completions.create(**ask).choices[0].message.content
    assert client.chat.completions.create(**ask).choices[0].message.content == first


def test_a_stop_sequence_ends_the_text_before_it_and_penalties_change_it(client):
    """User story: the openai client's ``stop`` ends the reply where the sequence first
    appears (finish_reason "stop"), and its presence/frequency penalties reach the sampler."""
    ask = dict(model="qwen3-omni", messages=[{"role": "user", "content": "Hi"}], max_tokens=16)
    full = client.chat.completions.create(**ask).choices[0].message.content
    visible = [i for i, ch in enumerate(full) if ch.isprintable() and ch != "\ufffd"]
    stop = full[next(i for i in visible if i >= 3)]  # a character some way in
    stopped = client.chat.completions.create(**ask, stop=[stop]).choices[0]
    assert stopped.message.content == full[: full.index(stop)]
    assert stopped.finish_reason == "stop"
    penalised = client.chat.completions.create(**ask, frequency_penalty=2.0, presence_penalty=2.0)
    assert penalised.choices[0].message.content != full  # greedy, and it repeats itself


def test_logit_bias_and_vllms_length_settings_reach_the_thinker(client, omni_processor):
    """User story: a client steers tokens with logit_bias, and a benchmark fixes reply lengths
    with vLLM's ignore_eos and min_tokens (all were silently ignored)."""
    end = omni_processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ask = dict(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        logit_bias={str(end): 100},
    )
    ended = client.chat.completions.create(**ask)  # the end of the turn comes first
    assert (ended.usage.completion_tokens, ended.choices[0].finish_reason) == (1, "stop")
    past = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert (past.usage.completion_tokens, past.choices[0].finish_reason) == (8, "length")
    held = client.chat.completions.create(**ask, extra_body={"min_tokens": 3})
    assert (held.usage.completion_tokens, held.choices[0].finish_reason) == (4, "stop")
    plain = dict(model="qwen3-omni", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    greedy = client.chat.completions.create(**plain).choices[0].message.content
    hot = dict(plain, temperature=1.5, seed=3)
    assert client.chat.completions.create(**hot).choices[0].message.content != greedy
    only_the_likeliest = client.chat.completions.create(**hot, extra_body={"min_p": 1.0})
    assert only_the_likeliest.choices[0].message.content == greedy


def test_a_spoken_reply_says_no_more_than_its_stop_string_left_of_the_text(
    served, reference_runs, omni_processor
):
    """User story: a spoken reply that ``stop`` cut says what its text says. The stop string
    is what the reply's tokens k+1 and k+2 spell (the greedy reply is transformers'), so its
    audio must be that of the reply cut after token k by ``max_tokens``: the Talker never
    voiced the string's tokens, though they came before vLLM knew."""
    from tests.reference import THINKER_MAX_TOKENS

    ids = reference_runs["image"].generated  # its tokens spell a few whole characters

    def text(n: int) -> str:
        return omni_processor.tokenizer.decode(ids[:n], skip_special_tokens=True)

    full = text(len(ids))
    k = next(
        k
        for k in range(1, len(ids) - 2)
        if len(text(k)) < len(text(k + 1)) < len(text(k + 2))
        and "\ufffd" not in text(k + 2)[len(text(k)) :]
        and full.index(text(k + 2)[len(text(k)) :]) == len(text(k))
    )
    stop = text(k + 2)[len(text(k)) :]

    def ask(max_tokens: int, **fields) -> dict:
        body = {
            "model": "qwen3-omni",
            "messages": [{"role": "user", "content": request_parts("image")}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"},
            "stage_overrides": {"talker": {"temperature": 0, "max_tokens": 48}},
            **fields,
        }
        r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        audio = base64.b64decode(choice["message"]["audio"]["data"])
        return choice | {"samples": sf.read(io.BytesIO(audio))[0]}

    stopped = ask(THINKER_MAX_TOKENS, stop=[stop])
    assert stopped["message"]["content"] == text(k) and stopped["finish_reason"] == "stop"
    cut = ask(k)  # a reply's last incomplete UTF-8 sequence is held back from its text
    assert cut["message"]["content"] == text(k).rstrip("\ufffd")
    assert len(stopped["samples"]) > 0
    assert stopped["samples"].tobytes() == cut["samples"].tobytes()


def test_a_sessions_next_turn_reuses_its_prefix_also_when_spoken(client):
    """Turn two (spoken: a text prompt needs no Thinker rows) computes only its new tokens."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    turn = [system, {"role": "user", "content": "Name a colour."}]
    session = {"session_id": "served-session-1"}
    first = client.chat.completions.create(
        model="qwen3-omni", messages=turn, max_tokens=4, extra_body=session
    )
    assert first.usage.prompt_tokens >= 256
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And another?"},
    ]
    second = client.chat.completions.create(
        model="qwen3-omni",
        messages=turn,
        max_tokens=4,
        extra_body=session,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens // 128 * 128  # vLLM's CPU block: 128 tokens
    assert second.choices[0].message.audio.data
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    assert 'omni_session_kv{what="prefixes"} 1.0' in lines  # turn two's, for turn three
    counted = [line for line in lines if line.startswith('omni_prompt_tokens_total{kind="cached"}')]
    assert float(counted[0].split()[-1]) >= cached


def _streamed_reply(body: dict) -> tuple[str, str]:
    """A streamed spoken reply's audio id (every audio delta carries it) and text."""
    ids, text = set(), ""
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"choices":[{' in line:
                delta = json.loads(line[len("data: ") :])["choices"][0]["delta"]
                text += delta.get("content") or ""
                ids |= {delta["audio"]["id"]} if "audio" in delta else set()
    assert len(ids) == 1
    return ids.pop(), text


def test_a_later_turn_names_an_earlier_spoken_reply_by_its_audio_id(client):
    """User story: OpenAI's multi-turn audio; the client sends a spoken reply back by its
    audio.id alone (non-streamed or streamed), and the next turn hears what the reply said."""
    ask = {"model": "qwen3-omni", "max_tokens": 6, "temperature": 0}
    hello = {"role": "user", "content": "Say hello."}
    first = client.chat.completions.create(
        messages=[hello],
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "wav"},
        **ask,
    )
    audio = first.choices[0].message.audio
    assert 3500 <= audio.expires_at - time.time() <= 3600  # api.spoken_reply_ttl_s
    streamed = _chat_body(stream=True, max_tokens=6, messages=[hello])
    for audio_id, text in ((audio.id, audio.transcript), _streamed_reply(streamed)):
        again = {"role": "user", "content": "Again."}
        by_id = client.chat.completions.create(
            messages=[hello, {"role": "assistant", "audio": {"id": audio_id}}, again], **ask
        )
        by_text = client.chat.completions.create(
            messages=[hello, {"role": "assistant", "content": text}, again], **ask
        )
        assert text and by_id.usage.prompt_tokens == by_text.usage.prompt_tokens
        assert by_id.choices[0].message.content == by_text.choices[0].message.content
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    kept = [line for line in lines if line.startswith('omni_spoken_replies{what="replies"}')]
    assert float(kept[0].split()[-1]) >= 2


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ("{not json", 400, "not valid JSON"),
        ({"model": "qwen3-omni", "messages": []}, 400, "messages"),
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
        (
            {
                "model": "qwen3-omni",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 10**6,
            },
            400,
            "max_tokens",
        ),
        (
            {
                "model": "qwen3-omni",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"},
                            }
                        ],
                    }
                ],
            },
            400,
            "could not decode audio",
        ),
        (
            {
                "model": "qwen3-omni",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "video_url",
                                "video_url": {"url": "data:video/mp4;base64,bm90IHZpZGVv"},
                            }
                        ],
                    }
                ],
            },
            400,
            "could not decode video",
        ),
        (
            {
                "model": "qwen3-omni",
                "messages": [{"role": "user", "content": "x"}],
                "modalities": ["text", "audio"],
                "audio": {"voice": "nobody"},
            },
            400,
            "unknown voice",
        ),
        (
            {"model": "qwen3-omni", "messages": [{"role": "user", "content": "word " * 5000}]},
            400,
            "this model's context is 4096 tokens",
        ),
        (
            {
                "model": "qwen3-omni",
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "audio": {"id": "audio-1"}},
                ],
            },
            400,
            "no spoken reply 'audio-1' is kept: unknown, or past its expires_at",
        ),
    ],
)
def test_bad_input_gets_a_4xx_with_a_reason(served, body, status, fragment):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}}
    if not isinstance(body, str):
        kwargs = {"json": body}
    r = httpx.post(f"{URL}/v1/chat/completions", timeout=60, **kwargs)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]["message"]
    # and the server still answers afterwards
    assert httpx.get(f"{URL}/v1/models", timeout=30).status_code == 200


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


def _chat_body(**extra) -> dict:
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": "Tell me something."}],
        "max_tokens": 10,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "stage_overrides": {"talker": {"temperature": 0, "max_tokens": 60}},
    }
    body.update(extra)
    return body


def test_streaming_concatenates_to_the_non_streamed_response(served):
    """SSE: text deltas and audio deltas join up to exactly the non-streamed answer."""
    whole = httpx.post(f"{URL}/v1/chat/completions", json=_chat_body(), timeout=120).json()
    whole_audio, _ = sf.read(
        io.BytesIO(base64.b64decode(whole["choices"][0]["message"]["audio"]["data"]))
    )
    body = _chat_body(stream=True, stream_options={"include_usage": True})
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
    body = _chat_body(max_tokens=24, stage_overrides={"talker": talker})
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
    body = _chat_body(stream=True, audio={"voice": "ethan", "format": "mp3"})
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "streamed audio" in r.json()["error"]["message"]


def test_health_reports_every_stage(served):
    r = httpx.get(f"{URL}/health", timeout=30)
    assert r.status_code == 200
    assert r.json()["stages"] == ["code2wav", "encoder", "talker", "thinker"]


def test_eight_concurrent_requests_complete_and_batch(served):
    """8 concurrent speech requests all finish, and the Talker decodes them together."""
    import concurrent.futures

    def one(i: int) -> httpx.Response:
        return httpx.post(f"{URL}/v1/chat/completions", json=_chat_body(seed=i), timeout=300)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, range(8)))
    assert [r.status_code for r in responses] == [200] * 8
    for r in responses:
        assert r.json()["choices"][0]["message"]["audio"]["data"]
    metrics = httpx.get(f"{URL}/metrics", timeout=30).text
    talker_batch = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('omni_stage_max_batch_size{stage="talker"}')
    )
    assert talker_batch > 1
    assert "omni_stage_latency_seconds_bucket" in metrics
    assert "omni_audio_seconds_total" in metrics
    assert metric(metrics, "omni_audio_real_time_factor_count") >= 8
    assert metric(metrics, 'omni_stage_latency_seconds_count{stage="first_frame"}') >= 8


def test_metrics_say_which_backend_each_stages_payloads_came_by(served):
    """An operator reads on /metrics that a spoken reply's audio reached the ingress through
    shared memory (one host), out of the Code2wav replica's pool, with nothing overflowing."""
    shared = 'omni_channel_taken_payloads{backend="shared_memory",stage="ingress"}'
    before = httpx.get(f"{URL}/metrics", timeout=30).text
    r = httpx.post(f"{URL}/v1/chat/completions", json=_chat_body(), timeout=300)
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
    """A streaming client that goes away mid-answer: the Talker and Thinker stop within ~1 s."""
    body = _chat_body(max_tokens=200)
    body["stage_overrides"]["talker"]["max_tokens"] = 500
    whole = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=300).json()
    # The client hangs up at the first audio: the work left after it must outlast the 1.5 s
    # window below, so that a stage still busy would show (a machine-speed-free precondition).
    left = whole["timings"]["total_s"] - whole["timings"]["first_audio_s"]
    assert left > 2.0, whole["timings"]
    body["stream"] = True
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            seen += '"audio"' in line
            if seen >= 1:
                break  # first audio arrived: hang up
    assert stages_idle_within(URL, 1.5)
    assert httpx.get(f"{URL}/health", timeout=30).status_code == 200


def test_a_request_past_its_deadline_gets_a_504_and_stops_every_stage(served):
    """A request whose timeout_s is shorter than its answer: 504 / an in-band timeout error,
    and no stage keeps working on it (the same request takes > 3 s without the deadline)."""
    body = _chat_body(max_tokens=200)
    body["stage_overrides"]["talker"]["max_tokens"] = 500
    body["timeout_s"] = 1.0
    start = time.monotonic()
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout_error"
    assert "1 s deadline" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3
    assert stages_idle_within(URL, 1.5)
    body["stream"] = True
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert '"timeout_error"' in lines[-2]
    assert stages_idle_within(URL, 1.5)
    assert (
        httpx.post(
            f"{URL}/v1/chat/completions", json={**body, "timeout_s": -1}, timeout=30
        ).status_code
        == 400
    )


def test_speech_endpoint_returns_audio_in_the_asked_format(client):
    """OpenAI TTS shape: the openai client gets a WAV (24 kHz) of the given text."""
    reply = client.audio.speech.create(
        model="qwen3-omni",
        input="Hello there.",
        voice="ethan",
        response_format="wav",
        extra_body={"stage_overrides": {"talker": {"max_tokens": 30}}},
    )
    samples, rate = sf.read(io.BytesIO(reply.content))
    assert rate == 24000 and len(samples) > 1920
    mp3 = httpx.post(
        f"{URL}/v1/audio/speech",
        timeout=120,
        json={
            "model": "qwen3-omni",
            "input": "Hi.",
            "response_format": "mp3",
            "stage_overrides": {"talker": {"max_tokens": 20}},
        },
    )
    assert mp3.status_code == 200 and mp3.headers["content-type"] == "audio/mpeg"
    assert sf.info(io.BytesIO(mp3.content)).format == "MP3"


def test_speech_streams_as_audio_bytes_and_as_sse(served):
    """Greedy Talker: the streamed bytes and the SSE deltas join to the one-shot WAV."""
    import json

    body = {
        "model": "qwen3-omni",
        "input": "One two three.",
        "response_format": "wav",
        "stage_overrides": {"talker": {"max_tokens": 40, "temperature": 0}},
    }
    whole, _ = sf.read(
        io.BytesIO(httpx.post(f"{URL}/v1/audio/speech", json=body, timeout=120).content)
    )
    with httpx.stream(
        "POST", f"{URL}/v1/audio/speech", json={**body, "stream_format": "audio"}, timeout=120
    ) as r:
        assert r.status_code == 200
        streamed, rate = sf.read(io.BytesIO(b"".join(r.iter_bytes())))
    assert rate == 24000 and np.array_equal(streamed, whole)
    with httpx.stream(
        "POST", f"{URL}/v1/audio/speech", json={**body, "stream_format": "sse"}, timeout=120
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    pcm = b"".join(
        base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
    )
    assert np.array_equal(np.frombuffer(pcm, "<i2") / 32768, whole)
    assert events[-1]["type"] == "speech.audio.done"


def test_transcriptions_and_translations_answer_as_the_chat_would(client):
    """User story: the openai client's audio.transcriptions (json, text, streamed) and
    audio.translations: the Thinker hears the clip and is told what to do after it, so the
    text is what a chat with those two parts gets (greedy)."""
    from omni_serve.testing.media import wav_b64

    wav = base64.b64decode(wav_b64(0.3 * np.sin(np.arange(16000) / 8).astype(np.float32), 16000))
    short = {"extra_body": {"max_completion_tokens": 12}}
    asks = [
        ("transcriptions", "Transcribe this audio into French.", {"language": "fr"}),
        ("translations", "Translate this audio into English.", {}),
    ]
    for route, told, fields in asks:
        create = getattr(client.audio, route).create
        heard = create(model="qwen3-omni", file=("clip.wav", wav), **fields, **short)
        chat = client.chat.completions.create(
            model="qwen3-omni",
            max_tokens=12,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {"data": base64.b64encode(wav).decode()},
                        },
                        {"type": "text", "text": told},
                    ],
                }
            ],
        )
        assert heard.text == chat.choices[0].message.content, route
        plain = create(
            model="qwen3-omni", file=("clip.wav", wav), response_format="text", **fields, **short
        )
        assert plain == heard.text
        if route == "transcriptions":  # the SDK's Translation has no usage
            assert (heard.usage.input_tokens, heard.usage.output_tokens) == (
                chat.usage.prompt_tokens,
                chat.usage.completion_tokens,
            )
    french = client.audio.transcriptions.create(
        model="qwen3-omni", file=("clip.wav", wav), language="fr", stream=True, **short
    )
    events = list(french)
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert events[-1].type == "transcript.text.done" and deltas == events[-1].text
    first = client.audio.transcriptions.create(
        model="qwen3-omni", file=("clip.wav", wav), language="fr", **short
    )
    assert deltas == first.text
    # the chat's own checks name the form's fields: the clip is the file, the length limit
    # vLLM's max_completion_tokens
    too_long = {"extra_body": {"max_completion_tokens": 10**6}}
    for fields, param in (
        ({"language": "xx"}, "language"),
        ({"file": ("x.wav", b"nope")}, "file"),
        (too_long, "max_completion_tokens"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(
                **{"model": "qwen3-omni", "file": ("clip.wav", wav), **fields}
            )
        assert refused.value.body["param"] == param
        assert param in refused.value.body["message"] or param != "max_completion_tokens"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input": ""}, "input"),
        ({"input": "x", "voice": "nobody"}, "unknown voice"),
        ({"input": "x", "stream_format": "audio", "response_format": "mp3"}, "wav or pcm"),
        ({"input": "x", "speed": 9}, "speed"),
        ({"input": "x", "instructions": "Speak cheerfully."}, "cannot be steered by instructions"),
    ],
)
def test_speech_bad_input_is_a_400(served, body, fragment):
    r = httpx.post(f"{URL}/v1/audio/speech", json={"model": "qwen3-omni", **body}, timeout=60)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]


async def _ws_collect(ws) -> list:
    import json

    out = []
    while True:
        frame = await ws.recv()
        out.append(frame if isinstance(frame, bytes) else json.loads(frame))
        if isinstance(out[-1], dict) and out[-1]["type"] in ("response.done", "error"):
            return out


async def test_websocket_streams_text_and_pcm_and_survives_bad_input(served):
    """One socket: a chat reply (text + PCM frames), a bad message (error, socket stays up),
    then a speech request."""
    import json

    import websockets

    async with websockets.connect("ws://127.0.0.1:8000/v1/audio/stream", max_size=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stage_overrides": {"talker": {"max_tokens": 30}},
                }
            )
        )
        events = await _ws_collect(ws)
        assert events[0]["type"] == "response.created"
        metas = [e for e in events if isinstance(e, dict) and e["type"] == "response.audio.delta"]
        frames = [e for e in events if isinstance(e, bytes)]
        assert metas and len(frames) == len(metas)
        assert [len(f) for f in frames] == [m["bytes"] for m in metas]
        assert (
            events[-1]["type"] == "response.done" and events[-1]["usage"]["completion_tokens"] == 8
        )
        timings = events[-1]["timings"]
        assert timings["first_token_s"] <= timings["first_frame_s"] <= timings["first_audio_s"]
        assert timings["rtf"] > 0

        await ws.send("{not json")
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["message"]
        await ws.send(json.dumps({"type": "chat", "messages": []}))
        assert "messages" in json.loads(await ws.recv())["error"]["message"]

        await ws.send(
            json.dumps(
                {
                    "type": "speech",
                    "input": "Bye.",
                    "stage_overrides": {"talker": {"max_tokens": 20}},
                }
            )
        )
        events = await _ws_collect(ws)
        assert events[-1]["type"] == "response.done"
        assert sum(len(f) for f in events if isinstance(f, bytes)) > 0


async def test_a_voice_sent_as_frames_is_heard_and_a_spoken_answer_can_be_cut_short(served):
    """User story: a voice client streams the microphone as PCM16 frames while the user talks,
    then asks for the reply (a first ask with a bad sample rate is refused and takes none of
    the voice), which hears what a chat sending the same clip hears; the user
    talks over the spoken reply (barge-in), the client cancels it, every stage stops, and the
    socket takes the next request."""
    import websockets

    from tests.reference import sample_audio

    pcm = np.round(sample_audio() * 32767).astype("<i2")
    wav = io.BytesIO()
    sf.write(wav, pcm, 16000, format="WAV", subtype="PCM_16")
    data = base64.b64encode(wav.getvalue()).decode()
    clip = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    ask = {"max_tokens": 6, "temperature": 0}
    chat = {"model": "qwen3-omni", "messages": [{"role": "user", "content": [clip]}], **ask}
    sent = httpx.post(f"{URL}/v1/chat/completions", json=chat, timeout=120).json()
    async with websockets.connect("ws://127.0.0.1:8000/v1/audio/stream", max_size=None) as ws:
        for chunk in np.array_split(pcm, 5):  # 0.3 s of voice per frame
            await ws.send(chunk.tobytes())
        await ws.send(json.dumps({"type": "chat", "input_audio": {"sample_rate": 100}}))
        refused = json.loads(await ws.recv())  # and the frames stay for the chat sent fixed
        assert refused["error"]["param"] == "input_audio.sample_rate"
        talker = {"talker": {"max_tokens": 20}}
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "input_audio": {"sample_rate": 16000},
                    "stage_overrides": talker,
                    **ask,
                }
            )
        )
        events = await _ws_collect(ws)
        heard = "".join(e["delta"] for e in events if isinstance(e, dict) and "delta" in e)
        assert heard == sent["choices"][0]["message"]["content"]
        assert events[-1]["status"] == "completed"
        assert events[-1]["usage"]["prompt_tokens"] == sent["usage"]["prompt_tokens"]

        long = _chat_body(max_tokens=200)  # seconds of work left after its first audio
        long["stage_overrides"]["talker"]["max_tokens"] = 500
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    **{
                        k: long[k]
                        for k in ("messages", "max_tokens", "temperature", "stage_overrides")
                    },
                }
            )
        )
        while not isinstance(await ws.recv(), bytes):  # up to the first audio frame
            pass
        await ws.send(json.dumps({"type": "response.cancel"}))
        events = await _ws_collect(ws)
        assert events[-1] == {
            "type": "response.done",
            "id": events[-1]["id"],
            "status": "cancelled",
        }
        assert stages_idle_within(URL, 1.5)
        await ws.send(
            json.dumps(
                {
                    "type": "speech",
                    "input": "Bye.",
                    "stage_overrides": {"talker": {"max_tokens": 10}},
                }
            )
        )
        events = await _ws_collect(ws)
        assert events[-1]["status"] == "completed" and any(isinstance(e, bytes) for e in events)


def test_a_killed_code2wav_replica_is_replaced_and_the_spoken_reply_still_arrives(client, served):
    """Code2wav (its only replica) dies mid-request: the request's later decode calls wait for
    the replacement Serve starts, and the client gets its whole spoken reply, not a 500. (The
    kill usually lands between two short decode calls; a call cut off while running is sent
    again, shown with the VAE in test_operations.py.)"""
    [pid] = replica_pids("code2wav")
    talker = {"max_tokens": 100, "seed": 3}  # ~8 s of audio: the kill lands mid-request
    ask = dict(
        model="qwen3-omni",
        messages=[{"role": "user", "content": "Tell a story."}],
        max_tokens=8,
        modalities=["text", "audio"],
        audio={"voice": "ethan"},
        extra_body={"stage_overrides": {"talker": talker}},
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(client.chat.completions.create, **ask)
        time.sleep(1.5)
        os.kill(pid, signal.SIGKILL)
        message = reply.result(timeout=240).choices[0].message
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)))
    assert rate == 24000 and len(samples) > 0
    deadline = time.monotonic() + 90  # the replacement replica loads its model first
    while httpx.get(f"{URL}/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the app is not healthy again after the kill"
        time.sleep(1)
    assert replica_pids("code2wav") - {pid}, "Serve did not replace the Code2wav replica"
