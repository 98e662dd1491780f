"""User story: the openai client's speech, transcription and translation calls work against the
served graph, speech also streamed as bytes and as SSE, and bad speech input is a 400."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from omni_serve.api.transcriptions import TRANSCRIPT_MIN_TOKENS
from tests.integration.served_qwen3_omni import URL

pytestmark = pytest.mark.integration


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
    # no max_completion_tokens: the budget follows the 1 s clip, not the server's limit
    unbounded = client.audio.transcriptions.create(model="qwen3-omni", file=("clip.wav", wav))
    assert unbounded.usage.output_tokens <= TRANSCRIPT_MIN_TOKENS
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
