"""Talker stage: the torch engine with continuous batching across concurrent requests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.common import pin_to_cores, stage_dtype, stage_setup
from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.torch_engine import TorchAREngine
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.transport import backend_for

# transformers' Qwen3-Omni generate() defaults for the Talker (it samples by default).
TALKER_DEFAULTS = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
TALKER_MAX_TOKENS = 4096  # codec frames (12.5 per second of audio); engine args may lower it


@serve.deployment
class TalkerDeployment:
    async def __init__(self, pipeline: dict[str, Any], stage_name: str = "talker") -> None:
        _, stage, model_path = stage_setup(pipeline, stage_name)
        pin_to_cores(stage.deployment.cpu_cores)
        talker, config = load_talker(model_path, dtype=stage_dtype(stage))
        self.builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(model_path))
        args = stage.engine.args
        self.max_tokens = int(args.get("max_new_tokens", TALKER_MAX_TOKENS))
        self.max_len = int(args.get("max_model_len", 8192))
        runner = TalkerRunner(
            talker, self.builder.tts_pad, max_batch_size=stage.engine.max_batch_size,
            max_len=self.max_len,
        )  # fmt: skip
        self.engine = TorchAREngine(runner, stop_token_ids=(runner.codec_eos_token_id,))
        await self.engine.start()

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        ref = request["prompt_rows"]
        channel = backend_for(ref)
        rows = await channel.get(ref)
        channel.free(ref)
        layers = sorted(rows)
        tokens = request["tokens"]
        prompt = self.builder.build_prompt(
            request["prompt_ids"],
            rows[layers[0]],
            rows[layers[-1]],
            tokens[0],
            request["voice"],
            image_grid_thw=request.get("image_grid_thw"),
            audio_seqlens=request.get("audio_seqlens"),
        )
        last = len(tokens) - 1
        trailing = [self.builder.trailing_row(t, i == last) for i, t in enumerate(tokens) if i]
        wanted = {**TALKER_DEFAULTS, **(request.get("sampling") or {})}
        budget = self._token_budget(len(prompt.embeds))
        wanted["max_tokens"] = min(wanted.get("max_tokens") or budget, budget)
        ar = ARRequest(
            request["request_id"], prompt_embeds=prompt.embeds,
            sampling=SamplingConfig(**wanted),
            extra={"position_ids": prompt.position_ids, "rope_delta": prompt.rope_delta,
                   "trailing": trailing, "text_done": True},
        )  # fmt: skip
        async for chunk in self.engine.generate(ar):
            if "codes" in chunk.outputs:
                yield {"codes": chunk.outputs["codes"]}

    def _token_budget(self, prompt_len: int) -> int:
        budget = min(self.max_tokens, self.max_len - prompt_len)
        if budget < 1:
            raise ValueError(f"talker prompt of {prompt_len} rows does not fit max_model_len")
        return budget

    def stats(self) -> dict[str, Any]:
        sizes = self.engine.batch_sizes
        return {
            "steps": self.engine.steps,
            "max_batch": max(sizes, default=0),
            "running": self.engine.num_running,
        }

    async def ready(self) -> bool:
        return True
