"""User story: a person opens the served app's page in a browser (headless Chromium here),
presses "Start talking" and speaks (Chromium's fake microphone plays a real speech clip):
the page shows the reply's transcript and plays its audio as it streams (and, with "Show my
words", the model's transcript of what was said), and speaking over the reply stops the
playback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omni_serve.testing.browser import SHOTS, browser_page
from omni_serve.testing.speech_clip import speak
from tests.integration.served_qwen3_omni import URL

pytestmark = pytest.mark.integration


@pytest.fixture
def microphone(tmp_path) -> Path:
    """A question, then 2.5 s of silence: Chromium loops the file, so the question comes again
    while the reply plays (the barge-in)."""
    speech = speak("Hello there. Please tell me a long story about the sea.", 48_000)
    clip = np.concatenate([np.zeros(24_000, np.float32), speech, np.zeros(120_000, np.float32)])
    path = tmp_path / "microphone.wav"
    sf.write(path, clip, 48_000, subtype="PCM_16")
    return path


def test_talking_to_the_page_shows_and_plays_the_reply_and_talking_over_it_stops_it(
    served, microphone
):
    fake_microphone = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}",
    ]
    with browser_page(*fake_microphone) as page:
        page.goto(URL)
        page.wait_for_function("document.getElementById('status').textContent === 'connected'")
        page.wait_for_function("document.getElementById('voice-select').value === 'ethan'")
        page.check("#transcribe")
        page.wait_for_function("window.playground.session?.audio.input.transcription !== null")
        page.click("#talk")
        page.wait_for_function(
            "document.querySelector('#transcript li.assistant')?.textContent.length > 0"
            " && window.playground.stats.played > 4800",
            timeout=180_000,
        )
        page.wait_for_function(  # "Show my words": the model's transcript of the question
            "document.querySelector('#transcript li.user')?.dataset.transcribed === '1'",
            timeout=180_000,
        )
        page.screenshot(path=SHOTS / "voice_reply.png")
        page.wait_for_function("window.playground.stats.stops >= 1", timeout=180_000)
        page.wait_for_function("document.getElementById('rtf').textContent !== '-'")
        page.screenshot(path=SHOTS / "voice_interrupted.png")
        stats = page.evaluate("window.playground.stats")
        assert stats["interruptions"] >= 1 and stats["errors"] == 0, stats
        assert page.locator("#transcript li.interrupted").count() >= 1
        assert page.locator("#transcript li.user").count() >= 1
        assert page.locator("#errors").inner_text() == ""


def test_a_typed_message_gets_a_spoken_reply_in_the_voice_picked(served):
    with browser_page() as page:
        page.goto(URL)
        page.wait_for_function("document.getElementById('voice-select').value === 'ethan'")
        voices = page.locator("#voice-select option").all_inner_texts()
        other = next(v for v in voices if v != "ethan")
        page.select_option("#voice-select", other)
        page.wait_for_function(f"window.playground.session?.audio.output.voice === '{other}'")
        page.fill("#text", "Hello!")
        page.click("#text-form button")
        page.wait_for_function(
            "document.querySelector('#transcript li.assistant')?.textContent.length > 0"
            " && window.playground.stats.played > 0",
            timeout=180_000,
        )
        assert page.locator("#transcript li.user").inner_text() == "Hello!"
        assert page.evaluate("window.playground.stats.errors") == 0
