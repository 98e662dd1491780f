"""User story: a person opens the served app's page in a browser (headless Chromium here),
presses "Start talking" and speaks (Chromium's fake microphone plays a real speech clip):
the page shows the reply's transcript and plays its audio as it streams, and speaking over
the reply stops the playback."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omni_serve.testing.serve_process import ServeProcess
from omni_serve.testing.speech_clip import speak

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).parents[2] / "load_tests" / "results" / "playground"


def browser_or_skip():
    """Playwright for Python with Debian's chromium (.ci/run installs both); a loud skip
    without them, never a silent pass."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("BROWSER TESTS NOT RUN: playwright is not installed (pip install -e .[dev])")
    if not Path(CHROMIUM).exists():
        pytest.skip("BROWSER TESTS NOT RUN: no chromium (apt-get install chromium)")
    return sync_playwright


@pytest.fixture(scope="module")
def served():
    server = ServeProcess("graphs.qwen3_omni:app", URL)
    server.start()
    yield server
    server.stop()


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
    sync_playwright = browser_or_skip()
    SHOTS.mkdir(parents=True, exist_ok=True)
    args = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={microphone}",
            "--autoplay-policy=no-user-gesture-required", "--no-sandbox", "--no-first-run",
            "--disable-background-networking", "--disable-component-update"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        page = browser.new_page(viewport={"width": 900, "height": 700})
        page.on("console", lambda message: print("page:", message.text))
        page.goto(URL)
        page.wait_for_function("document.getElementById('status').textContent === 'connected'")
        assert page.locator("#voice-select option").count() >= 1
        page.click("#talk")
        page.wait_for_function(
            "document.querySelector('#transcript li.assistant')?.textContent.length > 0"
            " && window.playground.stats.played > 4800", timeout=180_000,
        )  # fmt: skip
        page.screenshot(path=SHOTS / "voice_reply.png")
        page.wait_for_function("window.playground.stats.stops >= 1", timeout=180_000)
        page.screenshot(path=SHOTS / "voice_interrupted.png")
        stats = page.evaluate("window.playground.stats")
        assert stats["interruptions"] >= 1 and stats["errors"] == 0, stats
        assert page.locator("#transcript li.interrupted").count() >= 1
        assert page.locator("#transcript li.user").count() >= 1
        browser.close()
