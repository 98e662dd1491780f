"""User story: the second omni family, Qwen2.5-Omni, served from its Serve config YAML,
runs on the same deployments and API as Qwen3-Omni (its encoder stage included): the openai
client gets replies equal to transformers' (text, and audio within Token2Wav's chunking
bound), streamed or not; text to speech, the voice WebSocket, the Realtime API and batch jobs
speak; transcriptions hear; bad input gets a 400 (or a Realtime error event)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch
import websockets

from omni_serve.testing.realtime_client import user_text
from omni_serve.testing.realtime_fuzz import fuzz_session
from omni_serve.testing.serve_process import ServeProcess
from tests.reference import request_parts
from tests.reference_qwen2_5_omni import (
    SPEAKER,
    TALKER_MAX_TOKENS,
    THINKER_MAX_TOKENS,
    reference_run,
)

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
MODEL = "qwen2.5-omni"
CHUNKED_BOUND = 5e-4  # test_token2wav.py: chunked Token2Wav against its one-shot decode
WAV_STEP = 1 / 32767  # 16-bit WAV quantisation


@pytest.fixture(scope="module")
def served():
    """`serve run configs/qwen2_5_omni.yaml`: the Serve config form (what `serve deploy`
    takes), which these stories prove serves what the import path does."""
    with ServeProcess("configs/qwen2_5_omni.yaml", URL) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")


@pytest.fixture(scope="module")
def hf(tiny_qwen2_5_omni_path):
    from transformers import AutoProcessor, Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).eval()
    return model, AutoProcessor.from_pretrained(tiny_qwen2_5_omni_path)


def greedy_body(content, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": THINKER_MAX_TOKENS,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": SPEAKER.lower(), "format": "wav"},
        "stage_overrides": {"talker": {"temperature": 0, "max_tokens": TALKER_MAX_TOKENS}},
        **extra,
    }


def wav_of(message: dict) -> np.ndarray:
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])))
    assert rate == 24000
    return samples


def encoder_payloads() -> float:
    """What the encoder stage has taken off the channel (one media payload a request)."""
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    taken = [line for line in lines if line.startswith("omni_channel_taken_payloads{")]
    return sum(float(line.split()[-1]) for line in taken if 'stage="encoder"' in line)


@pytest.mark.parametrize("kind", ["text", "audio", "image", "video", "video_audio"])
def test_served_replies_equal_transformers(served, hf, kind):
    """Greedy through the graph == transformers' generate: the same text, and the waveform of
    the same codes (Token2Wav one-shot with the stage's noise) within the chunking bound
    (video_audio: a video the model hears too, its sound track interleaved with its frames).
    The encoder stage encoded the audio, image and video prompts' media; the Thinker the
    heard video's."""
    from omni_serve.models.qwen2_5_omni.token2wav import Token2WavDecoder, Token2WavSettings

    model, processor = hf
    ref = reference_run(model, processor, kind)
    hears = {"use_audio_in_video": kind == "video_audio"}
    body = greedy_body(request_parts(kind), **hears)
    before = encoder_payloads()
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert encoder_payloads() == before + (kind in ("audio", "image", "video"))
    message = r.json()["choices"][0]["message"]
    text = processor.tokenizer.decode(ref.generated, skip_special_tokens=True)
    assert message["content"] == text.rstrip("\ufffd")
    decoder = Token2WavDecoder(model.token2wav, model.speaker_map, Token2WavSettings())
    expected = decoder.decode(ref.codes[None], SPEAKER).numpy()
    samples = wav_of(message)
    assert samples.shape == expected.shape
    assert abs(samples - expected).max() <= CHUNKED_BOUND + WAV_STEP


def test_streamed_speech_is_the_non_streamed_reply(served):
    """The openai client's stream: text deltas, then PCM deltas that add up to the same text and
    samples as the whole reply (greedy Talker; Token2Wav's noise is a function of position)."""
    body = greedy_body("Say hello.")
    whole = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=120).json()
    message = whole["choices"][0]["message"]
    stream = {**body, "stream": True, "audio": {"voice": SPEAKER.lower(), "format": "pcm16"}}
    text, pcm = "", b""
    with httpx.stream("POST", f"{URL}/v1/chat/completions", json=stream, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            text += delta.get("content") or ""
            pcm += base64.b64decode((delta.get("audio") or {}).get("data") or "")
    assert text == message["content"]
    streamed = np.frombuffer(pcm, np.int16) / 32768
    assert len(streamed) == len(wav_of(message)) > 0
    assert abs(streamed - wav_of(message)).max() <= 2 * WAV_STEP


def test_openai_client_chats_in_both_voices_and_refuses_others(client):
    for voice in ("chelsie", "ethan"):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            modalities=["text", "audio"],
            audio={"voice": voice, "format": "wav"},
            extra_body={"stage_overrides": {"talker": {"max_tokens": 30}}},
        )
        assert reply.choices[0].message.audio.data
    with pytest.raises(openai.BadRequestError, match="unknown voice"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )


def test_a_clip_longer_than_the_model_hears_is_a_400_naming_it(client):
    """Qwen2.5-Omni hears 30 s of a clip at most: the openai client gets the reason and the part
    (not a reply that heard part of it)."""
    from omni_serve.testing.media import wav_b64

    clip = wav_b64(np.full(16000 * 31, 0.1, np.float32), 16000, "PCM_16")
    audio = {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}
    with pytest.raises(openai.BadRequestError, match="at most 30 s of audio per clip") as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [audio, {"type": "text", "text": "Hi"}]}],
            max_tokens=4,
        )
    assert caught.value.body["param"] == "messages[0].content[0]"


def test_text_to_speech_speaks(client):
    """/v1/audio/speech: the Thinker prefills the text's tokens too (this Talker reads each
    reply token's hidden row), so the speech is not empty."""
    speech = client.audio.speech.create(
        model=MODEL,
        voice="chelsie",
        input="Hello there.",
        response_format="wav",
        # Greedy: a sampled random-weight Talker may draw its end code early (CI once got 10
        # codes of the 40).
        extra_body={"stage_overrides": {"talker": {"max_tokens": 40, "temperature": 0}}},
    )
    samples, rate = sf.read(io.BytesIO(speech.content))
    assert rate == 24000 and len(samples) == 40 * 480  # 40 codes, 2 mel frames of 240 each
    assert np.sqrt((samples**2).mean()) > 0.01


async def test_the_voice_websocket_speaks(served):
    async with websockets.connect("ws://127.0.0.1:8000/v1/audio/stream", max_size=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "chat",
                    "max_tokens": 6,
                    "messages": [{"role": "user", "content": "Hi"}],
                    "stage_overrides": {"talker": {"max_tokens": 30}},
                }
            )
        )
        frames, last = [], None
        while last is None or last.get("type") not in ("response.done", "error"):
            frame = await ws.recv()
            if isinstance(frame, bytes):
                frames.append(frame)
            else:
                last = json.loads(frame)
        assert last["type"] == "response.done", last
        size = sum(len(f) for f in frames)  # PCM16, 480 samples a code, up to 30 codes
        assert 0 < size <= 30 * 480 * 2 and size % (480 * 2) == 0


async def test_a_realtime_client_gets_a_spoken_answer(served):
    """The official client's Realtime API: a text turn answered in audio and its transcript."""
    client = openai.AsyncOpenAI(base_url=f"{URL}/v1", api_key="unused")
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        await conn.conversation.item.create(item=user_text("Hi"))
        await conn.response.create(response={"max_output_tokens": 6})
        audio, done = b"", None
        async for event in conn:
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            if event.type in ("response.done", "error"):
                done = event
                break
    assert done.type == "response.done"  # max_output_tokens may cut it: "incomplete"
    assert done.response.status in ("completed", "incomplete")
    assert len(audio) > 0 and len(audio) % (480 * 2) == 0


async def test_fuzzed_realtime_events_get_no_server_fault_and_the_stages_answer_after(served):
    """A buggy Realtime client's odd events are each refused or done, none a server fault
    in this family's stages, and its next turn is answered."""
    report = await fuzz_session(f"ws://127.0.0.1:8000/v1/realtime?model={MODEL}", 500, seed=3)
    assert report.problems() == []
    assert report.seen["response.done"] > 2 and report.seen["error"] > 100


def test_a_transcription_is_what_the_chat_hears_and_a_long_clip_is_refused(client):
    """User story: the openai client's audio.transcriptions on Qwen2.5-Omni: the Thinker hears
    the clip and is told what to do after it (the text a greedy chat with those two parts
    gets); a clip over the 30 s this model hears is a 400 naming the form's file."""
    from omni_serve.testing.media import wav_b64

    wav = base64.b64decode(wav_b64(0.3 * np.sin(np.arange(16000) / 8).astype(np.float32), 16000))
    heard = client.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", wav), extra_body={"max_completion_tokens": 8}
    )
    clip = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode()}}
    told = {"type": "text", "text": "Transcribe this audio."}
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [clip, told]}]
    )
    assert heard.text == chat.choices[0].message.content
    long = base64.b64decode(wav_b64(np.full(16000 * 31, 0.1, np.float32), 16000, "PCM_16"))
    with pytest.raises(openai.BadRequestError, match="at most 30 s of audio") as refused:
        client.audio.transcriptions.create(model=MODEL, file=("long.wav", long))
    assert refused.value.body["param"] == "file"


def test_a_batch_job_writes_spoken_replies(served, tmp_path):
    """``python -m omni_serve.jobs.batch`` (what ``ray job submit`` runs) against this app: a
    spoken chat and a speech line each become their files."""
    import subprocess
    import sys

    lines = [
        {"custom_id": "hi", "url": "/v1/chat/completions", "body": greedy_body("Hi")},
        {
            "custom_id": "bye",
            "url": "/v1/audio/speech",
            "body": {"model": MODEL, "voice": "ethan", "input": "Bye.", "response_format": "wav"},
        },
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "omni_serve.jobs.batch", "--url", URL]
    command += ["--input", str(tmp_path / "in.jsonl"), "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert "2 ok, 0 failed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["bye.wav", "hi.txt", "hi.wav", "manifest.jsonl"]
    assert len(sf.read(out / "hi.wav")[0]) > 0 and len(sf.read(out / "bye.wav")[0]) > 0


def test_a_voice_conversations_next_spoken_turn_reuses_its_prefix(client):
    """User story: a voice chat's second spoken turn computes only its new tokens (the Thinker
    rows turn one kept, at every position, stand in for the cached ones) and says what the
    same turn says cold."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    turn = [system, {"role": "user", "content": "Name a colour."}]
    spoken = {
        "model": MODEL,
        "max_tokens": THINKER_MAX_TOKENS,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": SPEAKER.lower(), "format": "wav"},
    }
    talker = {"stage_overrides": {"talker": {"temperature": 0, "max_tokens": TALKER_MAX_TOKENS}}}
    session = {**talker, "session_id": "served-voice-25"}
    first = client.chat.completions.create(messages=turn, extra_body=session, **spoken)
    assert first.usage.prompt_tokens >= 256
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    turn += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And another?"},
    ]
    second = client.chat.completions.create(messages=turn, extra_body=session, **spoken)
    cold = client.chat.completions.create(messages=turn, extra_body=talker, **spoken)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens // 128 * 128  # vLLM's CPU block: 128 tokens
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == cold.choices[0].message.content
    heard, expected = (
        sf.read(io.BytesIO(base64.b64decode(r.choices[0].message.audio.data)))[0]
        for r in (second, cold)
    )
    assert heard.shape == expected.shape and abs(heard - expected).max() <= 2 * WAV_STEP


def test_health_names_the_stages(served):
    assert httpx.get(f"{URL}/health", timeout=30).json()["stages"] == [
        "code2wav",
        "encoder",
        "talker",
        "thinker",
    ]


def test_the_token2wav_stage_takes_the_pipelines_solver_settings(tiny_qwen2_5_omni_path):
    """What the served codec stage runs is the pipeline's (checked where it is built)."""
    from graphs.pipeline_paths import REPO
    from omni_serve.config import load_pipeline_config
    from omni_serve.models.registry import thinker_talker_family

    config = load_pipeline_config(REPO / "configs" / "pipelines" / "qwen2_5_omni_tiny.yaml")
    decoder, info = thinker_talker_family(config.family).load_codec(
        tiny_qwen2_5_omni_path, torch.float32, "cpu", config.stage("code2wav").engine
    )
    assert decoder.settings.num_steps == 10 and info.lookahead == 2 * 12
