"""Server VAD on real speech (eSpeak NG) with silero-vad's shipped weights: it hears the
speech start (less the prefix padding) and its end (after the silence window), the same
however the audio is split into appends, and nothing in silence or a quiet hum."""

from __future__ import annotations

import numpy as np
import pytest

from omni_serve.api.realtime.protocol import TurnDetection
from omni_serve.api.realtime.turn_detection import VoiceActivity, load_vad_model
from omni_serve.testing.speech_clip import pcm16, speak

RATE = 24_000


@pytest.fixture(scope="module")
def model():
    return load_vad_model()


def edges(model, pcm: bytes, chunk: int, **settings) -> list[tuple[str, int]]:
    vad = VoiceActivity(TurnDetection(type="server_vad", **settings), model)
    model.reset_states()
    found = []
    for i in range(0, len(pcm), chunk):
        found += [(e.kind, e.audio_ms) for e in vad.hear(pcm[i : i + chunk])]
    return found


def test_speech_is_heard_starting_and_stopping_whatever_the_appends(model):
    clip = speak("Good morning, how are you today?")
    pcm = pcm16(np.concatenate([np.zeros(RATE), clip, np.zeros(RATE)]))
    speech_end_ms = 1000 + len(clip) * 1000 // RATE
    by_chunk = {chunk: edges(model, pcm, chunk) for chunk in (960, 4800, 12_346)}
    first = by_chunk[960]
    assert [kind for kind, _ in first] == ["started", "stopped"]
    assert 600 <= first[0][1] <= 1100  # speech at 1000 ms, less 300 ms of prefix padding
    assert speech_end_ms + 400 <= first[1][1] <= speech_end_ms + 900  # + the 500 ms window
    for found in by_chunk.values():
        assert [k for k, _ in found] == ["started", "stopped"]
        assert all(abs(a - b) <= 64 for (_, a), (_, b) in zip(found, first, strict=True))


def test_a_longer_silence_window_waits_longer_and_silence_is_never_speech(model):
    pcm = pcm16(np.concatenate([np.zeros(RATE // 2), speak("Yes."), np.zeros(2 * RATE)]))
    short = edges(model, pcm, 4800, silence_duration_ms=200)
    long = edges(model, pcm, 4800, silence_duration_ms=1200)
    assert long[1][1] - short[1][1] >= 900
    hum = 0.01 * np.sin(2 * np.pi * 50 * np.arange(3 * RATE) / RATE)
    assert edges(model, pcm16(np.zeros(3 * RATE)), 4800) == []
    assert edges(model, pcm16(hum), 4800) == []


def test_a_pause_shorter_than_the_window_is_quiet_then_resumed_and_the_turn_ends_once(model):
    pause = np.zeros(RATE * 3 // 10)
    pcm = pcm16(
        np.concatenate(
            [np.zeros(RATE // 2), speak("One moment"), pause, speak("please."), np.zeros(RATE)]
        )
    )
    vad = VoiceActivity(TurnDetection(type="server_vad"), model, quiet_ms=100)
    model.reset_states()
    kinds = [e.kind for i in range(0, len(pcm), 960) for e in vad.hear(pcm[i : i + 960])]
    assert kinds == ["started", "quiet", "resumed", "quiet", "stopped"]
    model.reset_states()
    plain = VoiceActivity(TurnDetection(type="server_vad"), model)  # no quiet_ms: no such edges
    assert [e.kind for e in plain.hear(pcm)] == ["started", "stopped"]
