"""Headless Chromium for the playground's browser tests: Debian's ``chromium`` driven by
Playwright for Python (``.ci/run`` installs both; Playwright's own browser download cannot
run here). Without them a test skips with a loud reason; it never passes silently."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# No background traffic: this machine's network refuses it, many connections at a time.
QUIET = [
    "--no-sandbox",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--autoplay-policy=no-user-gesture-required",
]
SHOTS = Path(__file__).parents[2] / "load_tests" / "results" / "playground"


@contextmanager
def browser_page(*args: str, viewport: tuple[int, int] = (900, 700)) -> Iterator[Any]:
    """A Playwright page in headless Chromium started with ``args`` (beside ``QUIET``); its
    console lines are printed (pytest -s shows them)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("BROWSER TESTS NOT RUN: playwright is not installed (pip install -e .[dev])")
    if not Path(CHROMIUM).exists():
        pytest.skip("BROWSER TESTS NOT RUN: no chromium (apt-get install chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=[*QUIET, *args], headless=True
        )
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda message: print("page:", message.text))
            yield page
        finally:
            browser.close()
