"""Ingress of a text-to-image pipeline (Qwen-Image): OpenAI images API, and chat completions
with ``modalities: ["image"]``, orchestrating TextEncoder -> DiT -> VAE."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments import handle_calls
from deployments.common import (
    ReleasesSharedMemory,
    configure_http_guards,
    export_stage_metrics,
    in_serve_replica,
    ingress_app,
    ingress_stats,
)
from omni_serve.api import playground
from omni_serve.api.deadline import RequestTimeout, await_within, request_deadline
from omni_serve.api.errors import ApiError, check_model, refuse_unsupported, stage_failure
from omni_serve.api.images import ImageGenerationRequest, images_b64, parse_size
from omni_serve.api.protocol import ChatCompletionRequest, new_id
from omni_serve.api.validation_errors import most_specific
from omni_serve.config import PipelineConfig
from omni_serve.models.qwen_image.image_flow import ImageOptions, ImageResult, generate_images
from omni_serve.models.qwen_image.messages import DenoiseRequest
from omni_serve.observability.metrics import ApiMetrics
from omni_serve.transport import announce, take

app = ingress_app("omni-serve (text to image)")
log = logging.getLogger("ray.serve")


class _HandleClients:
    """``ImageClients`` over Serve handles."""

    def __init__(self, handles: dict[str, DeploymentHandle]) -> None:
        self.handles = handles

    async def encode(self, prompts: list[str]) -> list[Any]:
        return await handle_calls.call(self.handles["text_encoder"].encode, prompts)

    async def denoise(self, request: DenoiseRequest) -> list[Any]:
        return await handle_calls.call(self.handles["dit"].denoise, request)

    async def decode(self, latents: Any, height: int, width: int) -> Any:
        return await handle_calls.call(self.handles["vae"].decode, latents, height, width)

    async def fetch(self, ref: Any) -> Any:
        return await take(ref)


def _chat_prompt(body: ChatCompletionRequest) -> str:
    """The last user message's text is the image prompt."""
    for message in reversed(body.messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        return " ".join(p.text for p in message.content if p.type == "text")
    raise ApiError(400, "messages: no user message to draw", param="messages")


def _pixels(size: str) -> int:
    width, _, height = size.partition("x")
    return int(width) * int(height)


# Keep module-level helpers ABOVE this class: Serve pickles the class by value when the
# decorator runs, so a global defined below it is missing in the replica (NameError).
@serve.deployment
@serve.ingress(app)
class ImageIngress(ReleasesSharedMemory):
    def __init__(
        self,
        pipeline: dict[str, Any],
        text_encoder: DeploymentHandle,
        dit: DeploymentHandle,
        vae: DeploymentHandle,
    ) -> None:
        announce()  # it maps the VAE's images: producers must know which host it is on
        self.config = PipelineConfig.model_validate(pipeline)
        configure_http_guards(self.config)
        self.handles = {"text_encoder": text_encoder, "dit": dit, "vae": vae}
        self.clients = _HandleClients(self.handles)
        self.metrics = ApiMetrics(to_ray=in_serve_replica())
        self.metrics_export = export_stage_metrics("ingress", ingress_stats)
        self.created = int(time.time())
        dit_stage = next(stage for stage in self.config.stages if stage.kind == "dit")
        step_cache = dit_stage.engine.step_cache
        mask = step_cache.steps_mask if step_cache and step_cache.enabled else None
        self.step_mask_length = len(mask) if mask is not None else None
        api = self.config.api
        sizes = [api.image_default_size, "256x256", "512x512", "1024x1024"]
        sizes = [s for s in dict.fromkeys(sizes) if _pixels(s) <= api.image_max_pixels]
        playground.configure(
            api.playground,
            "image",
            self.config.served_model_name,
            sizes=sizes,
            default_steps=api.image_default_steps,
        )

    async def observe_stores(self) -> None:
        """It keeps no stores."""

    async def degraded(self) -> dict[str, str]:
        return {}

    @app.post("/v1/images/generations")
    async def generations(self, body: ImageGenerationRequest) -> dict[str, Any]:
        result = await self._run(self._options(body), body.timeout_s)
        fmt, quality = body.output_format, body.output_compression
        encoded = await asyncio.to_thread(images_b64, result.images, fmt, quality)
        return {
            "created": int(time.time()),
            "data": [{"b64_json": data} for data in encoded],
            "output_format": fmt,
            "seeds": result.seeds,
            "timings": result.timings,
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        if body.stream:
            raise ApiError(400, "stream: image generation answers in one piece", param="stream")
        if "image" not in body.modalities:
            raise ApiError(
                400, "modalities: this model generates images: send ['image']", "modalities"
            )
        refuse_unsupported(body)
        try:
            request = ImageGenerationRequest(prompt=_chat_prompt(body), seed=body.seed)
        except ValidationError as exc:  # e.g. an empty or overlong prompt in the message
            reason = most_specific(exc.errors()).reason
            message = f"messages: the last user message is not a usable prompt ({reason})"
            raise ApiError(400, message, "messages") from None
        result = await self._run(self._options(request), body.timeout_s)
        encoded = await asyncio.to_thread(images_b64, result.images)
        parts = [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
            for data in encoded
        ]
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": parts},
                }
            ],
            "timings": result.timings,
        }

    def _options(self, body: ImageGenerationRequest) -> ImageOptions:
        api = self.config.api
        check_model(body.model, self.config.served_model_name)
        try:
            width, height = parse_size(body.size or api.image_default_size, api.image_max_pixels)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="size") from None
        steps = body.num_inference_steps or api.image_default_steps
        mask = self.step_mask_length
        if mask is not None and steps != mask:
            message = f"num_inference_steps: this server's DiT step-cache mask needs {mask} steps"
            raise ApiError(400, message, param="num_inference_steps")
        return ImageOptions(
            prompt=body.prompt,
            width=width,
            height=height,
            n=body.n,
            steps=steps,
            negative_prompt=body.negative_prompt,
            true_cfg_scale=body.true_cfg_scale,
            seed=body.seed,
        )

    async def _run(self, options: ImageOptions, timeout_s: float | None) -> ImageResult:
        deadline = request_deadline(timeout_s, self.config.api.request_timeout_s)
        self.metrics.in_flight.inc()
        try:
            # Nothing reaches the client before the images do: a replica death costs a rerun.
            result = await await_within(
                handle_calls.rerun_after_replica_death(
                    lambda: generate_images(self.clients, options)
                ),
                deadline,
            )
        except RequestTimeout as exc:
            self.metrics.requests.labels("timeout").inc()
            raise ApiError(504, str(exc), "timeout_s", type_="timeout_error") from None
        except Exception as exc:
            log.exception("image request failed in a stage")
            self.metrics.requests.labels("error").inc()
            raise stage_failure(exc) from None
        finally:
            self.metrics.in_flight.dec()
        self.metrics.requests.labels("ok").inc()
        self.metrics.observe_result(result.timings, 0, 0.0)
        return result
