"""User story: from the repo root, `serve run graphs.qwen_image:app` serves the tiny
Qwen-Image graph; the openai client's images.generate gets PNGs equal to what diffusers'
one-pass pipeline draws for the same seed."""

from __future__ import annotations

import base64
import concurrent.futures
import io

import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omni_serve.testing.serve_process import ServeProcess
from omni_serve.testing.served_metrics import fresh_metrics

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def served():
    with ServeProcess("graphs.qwen_image:app", URL) as server:
        yield server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")


def test_the_served_model_is_listed_and_retrievable(client):
    assert [m.id for m in client.models.list().data] == ["qwen-image"]
    assert client.models.retrieve("qwen-image").id == "qwen-image"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")


def png(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def diffusers_image(path, prompt: str, negative: str | None, seed: int, w: int, h: int, steps: int):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(path)
    image = pipe(
        prompt,
        negative_prompt=negative,
        true_cfg_scale=4.0,
        height=h,
        width=w,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
    ).images[0]
    return (image * 255).round().astype(np.uint8)


def lighthouse(negative: str | None) -> dict:
    """Two 96x64 images of 4 steps from seed 11 (``lighthouse_reference`` is the first)."""
    body = {"prompt": "a lighthouse at dusk", "size": "96x64", "num_inference_steps": 4}
    return {**body, "seed": 11, "n": 2, **({"negative_prompt": negative} if negative else {})}


def lighthouse_reference(tiny_image_path, negative: str | None) -> np.ndarray:
    return diffusers_image(tiny_image_path, "a lighthouse at dusk", negative, 11, 96, 64, 4)


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_served_image_equals_diffusers(served, tiny_image_path, negative):
    body = lighthouse(negative)
    r = httpx.post(f"{URL}/v1/images/generations", json=body, timeout=300)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["seeds"] == [11, 12] and len(data["data"]) == 2
    first, second = png(data["data"][0]["b64_json"]), png(data["data"][1]["b64_json"])
    assert first.shape == (64, 96, 3)
    reference = lighthouse_reference(tiny_image_path, negative)
    assert np.abs(first.astype(int) - reference).max() <= 1
    assert np.abs(second.astype(int) - reference).max() > 10  # seed + 1 is another image


def test_openai_client_and_default_size(client):
    result = client.images.generate(prompt="a red cube", n=1)
    assert png(result.data[0].b64_json).shape == (256, 256, 3)  # the pipeline's default


def test_the_openai_client_asks_for_jpeg_and_webp(client):
    """The same seed's image, encoded as asked (output_format, output_compression)."""
    ask = dict(prompt="a red cube", size="64x64", extra_body={"seed": 5, "num_inference_steps": 2})
    reference = png(client.images.generate(**ask).data[0].b64_json)
    for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP")):
        result = client.images.generate(**ask, output_format=fmt, output_compression=90)
        encoded = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
        assert encoded.format == pil and result.output_format == fmt
        lossy = np.asarray(encoded.convert("RGB"), dtype=int)
        assert np.abs(lossy - reference).mean() < 20  # the same picture, roughly


def test_concurrent_requests_batch_in_the_dit(served):
    body = {"prompt": "a cat", "size": "64x64", "num_inference_steps": 8}

    def one(i: int) -> httpx.Response:
        return httpx.post(f"{URL}/v1/images/generations", json={**body, "seed": i}, timeout=300)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    images = [png(r.json()["data"][0]["b64_json"]) for r in responses]
    assert len({i.tobytes() for i in images}) == 6
    metrics = fresh_metrics(URL, ("dit", "vae"))
    assert any(
        line.startswith('omni_stage_max_batch_size{stage="dit"}') and float(line.split()[-1]) >= 2
        for line in metrics.splitlines()
    ), metrics
    taken = [line for line in metrics.splitlines() if line.startswith("omni_channel_taken_pay")]
    for stage in ("dit", "vae", "ingress"):  # prompt embeddings, latents, the image
        read = [float(line.split()[-1]) for line in taken if f'stage="{stage}"' in line]
        assert sum(read) >= 6, taken  # this test's 6 requests at least


def test_a_short_request_joins_the_running_batch_and_finishes_first(served):
    """Step-level batching: a 2-step request that arrives while a 100-step one denoises (~6 s
    here; its VAE decode takes twice that) joins it at the next step instead of waiting for
    all 100."""
    import time

    long = {"prompt": "a long walk", "size": "768x768", "num_inference_steps": 100, "seed": 1}
    short = {**long, "prompt": "a dot", "num_inference_steps": 2, "seed": 2}
    done: dict[str, float] = {}

    def post(name: str, body: dict) -> int:
        r = httpx.post(f"{URL}/v1/images/generations", json=body, timeout=300)
        done[name] = time.monotonic()
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, "long", long)
        time.sleep(1.0)  # the long one is denoising by now
        second = pool.submit(post, "short", short)
        assert first.result() == second.result() == 200
    assert done["short"] < done["long"], done
    assert "joined a running batch" in served.tail(200_000)


def test_chat_completions_with_image_modality(served):
    body = {
        "model": "qwen-image",
        "modalities": ["image"],
        "seed": 3,
        "messages": [{"role": "user", "content": "a green field"}],
    }
    r = httpx.post(f"{URL}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    part = r.json()["choices"][0]["message"]["content"][0]
    assert part["type"] == "image_url"
    assert png(part["image_url"]["url"].split(",", 1)[1]).shape == (256, 256, 3)
    two = httpx.post(f"{URL}/v1/chat/completions", json={**body, "n": 2}, timeout=60)
    assert two.status_code == 400 and "1 choice per request" in two.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"prompt": "  "}, "prompt must not be empty"),
        ({"prompt": "x", "size": "100x64"}, "multiple of 16"),
        ({"prompt": "x", "size": "big"}, "size must look like"),
        ({"prompt": "x", "size": "4096x4096"}, "larger than this server allows"),
        ({"prompt": "x", "n": 9}, "n"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "response_format": "url"}, "response_format"),
        ({"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
        ({"size": "64x64"}, "prompt"),
    ],
)
def test_bad_image_requests_get_a_400_with_a_reason(served, body, fragment):
    r = httpx.post(f"{URL}/v1/images/generations", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


def test_health_names_the_stages(served):
    r = httpx.get(f"{URL}/health", timeout=30)
    assert r.status_code == 200 and r.json()["stages"] == ["dit", "text_encoder", "vae"]


def _live_segments() -> dict[str, int]:
    """State (free / in use) of each shared-memory segment of a live producer."""
    from omni_serve.transport import shm_pool as shm

    states = {}
    for path in shm.SHM_DIR.glob(f"{shm.PREFIX}*"):
        pid = int(path.name.removeprefix(shm.PREFIX).split("-")[0])
        if shm.pid_alive(pid):
            with open(path, "rb") as f:
                states[path.name] = shm.HEADER.unpack(f.read(shm.HEADER.size))[1]
    return states


def test_requests_leave_no_channel_segment_in_use_and_the_pool_stays_flat(served):
    """Leak check: images (256x256, 196 KB) cross the VAE -> ingress edge in shared memory;
    after many requests every segment is free again and the pool has not grown."""
    body = {"prompt": "a pebble", "size": "256x256", "num_inference_steps": 1}

    def run(count: int) -> None:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = list(
                pool.map(
                    lambda i: (
                        httpx.post(
                            f"{URL}/v1/images/generations", json={**body, "seed": i}, timeout=300
                        ).status_code
                    ),
                    range(count),
                )
            )
        assert codes == [200] * count

    run(8)
    warm = _live_segments()
    assert warm and set(warm.values()) == {0}  # used, and all handed back
    run(32)
    after = _live_segments()
    assert set(after.values()) == {0}
    assert len(after) <= len(warm) + 2  # reused, not one segment per request


def test_an_image_request_past_its_deadline_gets_a_504_and_frees_the_dit(served):
    """A request that runs past its timeout_s gets a 504, and the DiT stops its steps: a small
    request right after is not queued behind the dropped one."""
    import time

    big = {"prompt": "a harbour", "size": "768x768", "num_inference_steps": 100, "seed": 1}
    r = httpx.post(f"{URL}/v1/images/generations", json=big, timeout=300)
    dit_s = r.json()["timings"]["dit_s"]
    assert dit_s > 3  # long enough that a DiT still busy with it would show
    r = httpx.post(f"{URL}/v1/images/generations", json={**big, "timeout_s": 0.5}, timeout=60)
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    start = time.monotonic()
    small = {"prompt": "a dot", "size": "64x64", "num_inference_steps": 1}
    assert httpx.post(f"{URL}/v1/images/generations", json=small, timeout=60).status_code == 200
    assert time.monotonic() - start < dit_s / 3, (time.monotonic() - start, dit_s)
