"""User story: a stage replica that dies mid-request is replaced, and the client still gets its
whole spoken reply."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import os
import signal
import time

import httpx
import pytest
import soundfile as sf

from omni_serve.testing.serve_process import replica_pids
from tests.integration.served_qwen3_omni import URL

pytestmark = pytest.mark.integration


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
