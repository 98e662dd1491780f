"""User story: a voice client on /v1/audio/stream gets text and PCM streamed back, is heard when
it sends its voice as frames, and can cut a spoken answer short."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from omni_serve.testing.served_metrics import stages_idle_within
from tests.integration.served_qwen3_omni import URL, chat_body

pytestmark = pytest.mark.integration


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

        long = chat_body(max_tokens=200)  # seconds of work left after its first audio
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
        assert stages_idle_within(URL)
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
