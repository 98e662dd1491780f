"""User story: the official openai client chats with the served graph: text and a 24 kHz WAV
back, greedy replies that repeat, its sampling settings honoured, sessions that reuse their KV,
earlier spoken replies named by id, and bad input answered with a 4xx that says why."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import openai
import pytest
import soundfile as sf

from tests.integration.served_qwen3_omni import URL, chat_body
from tests.reference import request_parts

pytestmark = pytest.mark.integration


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
    hits = [line for line in lines if line.startswith('omni_session_kv{tier="host",what="hits"}')]
    assert float(hits[0].split()[-1]) >= 1  # turn one's prefix, kept in memory for turn two
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
    streamed = chat_body(stream=True, max_tokens=6, messages=[hello])
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
