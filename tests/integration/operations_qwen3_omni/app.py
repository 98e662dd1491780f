"""What every story against the operations app shares: its address and the requests they send."""

from __future__ import annotations

import base64
import io

import httpx
import soundfile as sf

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import replica_pids

URL = "http://127.0.0.1:8000"
MODEL = {"model": "qwen3-omni"}
SPOKEN = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}


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
