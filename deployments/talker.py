"""Talker stage: the torch engine with continuous batching across concurrent requests.

It follows the Thinker token by token: ``speak`` consumes the Thinker's stream itself (a chain
of streaming calls, so no replica affinity is needed) and yields its text chunks together with
the codec frames it makes from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.common import ReleasesSharedMemory, export_stage_metrics, torch_stage
from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.registry import thinker_talker_family
from omni_serve.models.thinker_talker.messages import SpeakRequest, decoded, to_wire
from omni_serve.models.thinker_talker.speech_session import given_reply, speak
from omni_serve.transport import channel_stats, release, take

TALKER_MAX_TOKENS = 4096  # codec frames; engine args may lower it


@serve.deployment
class TalkerDeployment(ReleasesSharedMemory):
    async def __init__(
        self, pipeline: dict[str, Any], stage_name: str, thinker: DeploymentHandle
    ) -> None:
        setup = torch_stage(pipeline, stage_name)
        stage, model_path, device = setup.stage, setup.model_path, setup.device
        args = stage.engine.args
        self.max_tokens = int(args.get("max_new_tokens", TALKER_MAX_TOKENS))
        self.max_len = int(args.get("max_model_len", 8192))
        family = thinker_talker_family(setup.config.family)
        parts = family.load_talker(model_path, setup.dtype, device, stage.engine, self.max_len)
        self.feed, self.defaults = parts.feed, parts.sampling_defaults
        self.engine = TorchAREngine(parts.runner, stop_token_ids=parts.stop_token_ids)
        await self.engine.start()
        self.thinker = thinker.options(stream=True)
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def speak(self, request: SpeakRequest) -> AsyncIterator[list[Any]]:
        """The reply's ``SpeakEvent``s in their wire form (``messages.to_wire``)."""
        wanted = {**self.defaults, **(request.sampling or {})}

        def sampling(prompt_len: int) -> SamplingConfig:
            budget = self.max_len - prompt_len
            if budget < 1:
                raise ValueError(f"talker prompt of {prompt_len} rows does not fit max_model_len")
            cap = min(wanted.get("max_tokens") or self.max_tokens, self.max_tokens, budget)
            return SamplingConfig(**{**wanted, "max_tokens": cap})

        thinker = request.thinker
        reads_rows = bool(request.reply_ids) and self.feed.reads_reply_rows
        if reads_rows:  # its rows of the reply's tokens too: the Thinker runs them
            thinker = dataclasses.replace(
                thinker, prompt_ids=[*thinker.prompt_ids, *request.reply_ids]
            )
        chunks = decoded(self.thinker.generate.remote(thinker))
        if request.reply_ids:
            chunks = given_reply(chunks, request.reply_ids, take if reads_rows else None)
        events = speak(chunks, self.engine, self.feed, request, sampling, take, release)
        async for event in events:
            yield to_wire(event)

    async def ready(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        stats = self.engine.stats.as_dict()
        return {**stats, "running": self.engine.num_running, "channel": channel_stats()}
