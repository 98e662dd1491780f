"""User story: a person opens the page of an image app that needs an API key: the page asks
for the key, then makes an image from a prompt, size, steps and seed, shows it with a
download link, and shows a request the server refuses with the server's own reason."""

from __future__ import annotations

import base64

import pytest

from omni_serve.testing.browser import SHOTS, browser_page
from omni_serve.testing.serve_process import ServeProcess

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
KEY = "playground-key"  # tests/integration/pipelines/qwen_image_keyed.yaml


@pytest.fixture(scope="module")
def served():
    config = "pipeline_config=tests/integration/pipelines/qwen_image_keyed.yaml"
    with ServeProcess("graphs.qwen_image:build_app", URL, args=(config,)) as server:
        yield server


def test_the_page_asks_for_the_key_then_makes_and_shows_an_image(served):
    with browser_page() as page:
        page.goto(URL)
        page.wait_for_selector("#key-form:not([hidden])")
        assert "API key" in page.locator("#errors").inner_text()
        page.fill("#key", KEY)
        page.click("#key-form button")
        page.wait_for_selector("#image:not([hidden])")
        assert page.evaluate("sessionStorage.getItem('omni-serve-key')") == KEY
        assert page.locator("#size").input_value() == "256x256"  # the pipeline's default first
        page.fill("#prompt", "a lighthouse at dusk")
        page.fill("#steps", "2")
        page.fill("#seed", "7")
        page.click("#image-form button")
        page.wait_for_selector("#result:not([hidden])", timeout=180_000)
        page.screenshot(path=SHOTS / "image.png")
        size = page.evaluate(
            "[document.getElementById('picture').naturalWidth,"
            " document.getElementById('picture').naturalHeight]"
        )
        assert size == [256, 256]
        href = page.get_attribute("#download", "href")
        assert base64.b64decode(href.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_refused_request_shows_the_servers_reason_on_the_page(served):
    with browser_page() as page:
        page.goto(URL)
        page.evaluate(f"sessionStorage.setItem('omni-serve-key', '{KEY}')")
        page.reload()
        page.wait_for_selector("#image:not([hidden])")
        page.fill("#prompt", "a cat")
        page.evaluate("document.getElementById('steps').removeAttribute('max')")
        page.fill("#steps", "1000")  # past the API's limit of 100
        page.click("#image-form button")
        page.wait_for_function("document.getElementById('errors').textContent.length > 0")
        shown = page.locator("#errors").inner_text()
        assert shown.startswith("400") and "num_inference_steps" in shown, shown
