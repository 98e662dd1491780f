"""The image ingress runs a request again from the start when a stage replica died under it:
the client has received nothing yet, so it gets its image instead of a 503."""

from __future__ import annotations

import types

import pytest
import torch

from deployments.image_ingress import ImageIngress
from omni_serve.api.errors import ApiError, ReplicaDied
from omni_serve.models.qwen_image.image_flow import ImageOptions
from omni_serve.observability.metrics import ApiMetrics

# The class under Serve's ASGI wrapper (whose async __del__ only warns on hand-built objects).
IngressClass = next(
    k for k in ImageIngress.func_or_class.__mro__[1:] if k.__name__ == "ImageIngress"
)


class FakeClients:
    """Stages that answer at once; the VAE's first ``deaths`` decodes die."""

    def __init__(self, deaths: int) -> None:
        self.deaths, self.encodes = deaths, 0

    async def encode(self, prompts):
        self.encodes += 1
        return ["rows"] * len(prompts)

    async def denoise(self, request):
        return ["latents"] * len(request.seeds)

    async def decode(self, latents, height, width):
        if self.deaths:
            self.deaths -= 1
            raise ReplicaDied("vae")
        return "image"

    async def fetch(self, ref):
        return torch.zeros(4, 4, 3, dtype=torch.uint8)


def _ingress(clients: FakeClients):
    ingress = object.__new__(IngressClass)
    ingress.clients, ingress.metrics = clients, ApiMetrics()
    ingress.config = types.SimpleNamespace(api=types.SimpleNamespace(request_timeout_s=30.0))
    return ingress


OPTIONS = ImageOptions(prompt="a red kite", width=64, height=64, steps=2, seed=1)


async def test_a_replica_death_costs_a_rerun_not_the_request():
    clients = FakeClients(deaths=1)
    result = await _ingress(clients)._run(OPTIONS, None)
    assert len(result.images) == 1 and clients.encodes == 2  # run again from the start


async def test_a_second_death_is_a_503_with_retry_after():
    with pytest.raises(ApiError) as failed:
        await _ingress(FakeClients(deaths=2))._run(OPTIONS, None)
    assert failed.value.status == 503 and failed.value.headers == {"Retry-After": "5"}


@pytest.mark.parametrize("route", ["generations", "chat_completions"])
async def test_images_are_encoded_off_the_event_loop(monkeypatch, route):
    """A few large images take a second of CPU to encode: on the loop they would stall every
    other request of the replica."""
    import threading

    from omni_serve.api.images import ImageGenerationRequest
    from omni_serve.api.protocol import ChatCompletionRequest

    threads = []

    def recording(images, *args):
        threads.append(threading.current_thread())
        return ["aW1n"] * len(images)

    # the globals the route methods read (Serve's decorator may hold a copy of the module's)
    monkeypatch.setitem(IngressClass.generations.__globals__, "images_b64", recording)
    ingress = _ingress(FakeClients(deaths=0))
    ingress.config = types.SimpleNamespace(
        served_model_name="qwen-image",
        api=types.SimpleNamespace(
            request_timeout_s=30.0,
            image_default_size="64x64",
            image_max_pixels=1024 * 1024,
            image_default_steps=2,
        ),
    )
    ingress.step_mask_length = None
    if route == "generations":
        body = ImageGenerationRequest(prompt="a red kite", output_format="jpeg")
        answer = await IngressClass.generations(ingress, body)
        assert answer["data"] == [{"b64_json": "aW1n"}] and answer["output_format"] == "jpeg"
    else:
        kite = [{"role": "user", "content": "a red kite"}]
        body = ChatCompletionRequest(model="qwen-image", modalities=["image"], messages=kite)
        answer = await IngressClass.chat_completions(ingress, body)
        url = answer["choices"][0]["message"]["content"][0]["image_url"]["url"]
        assert url == "data:image/png;base64,aW1n"
    assert threads and threading.main_thread() not in threads


async def test_a_chat_whose_message_is_no_prompt_is_a_400_with_the_prompts_reason():
    from omni_serve.api.protocol import ChatCompletionRequest

    blank = [{"role": "user", "content": "   "}]
    body = ChatCompletionRequest(model="qwen-image", modalities=["image"], messages=blank)
    with pytest.raises(ApiError) as refused:
        await IngressClass.chat_completions(_ingress(FakeClients(deaths=0)), body)
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert refused.value.message == (
        "messages: the last user message is not a usable prompt (prompt must not be empty)"
    )
