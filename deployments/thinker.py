"""Thinker stage: vLLM AsyncLLM, streaming tokens; the prompt's hidden rows go on the tensor
channel and only their reference rides the stream. With a ``session_kv`` edge (thinker ->
thinker) a session's turns hand their prompt's KV blocks to the next turn over the channel."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import torch
from ray import serve

from deployments.common import edge_channel, find_edge, stage_setup
from omni_serve.api.errors import StageRejectedInput
from omni_serve.engines.ar.base import ARRequest, PromptRejected, SamplingConfig
from omni_serve.engines.ar.vllm_engine import VLLMEngine, channel_kv_transfer_config
from omni_serve.models.qwen3_omni.checkpoint import load_config, load_thinker_embeddings
from omni_serve.models.qwen3_omni.talker_inputs import TOKEN_EMBEDDINGS, needs_captured_rows
from omni_serve.transport import take
from omni_serve.transport.kv_blocks import EXPORT_KEY, PREFIX_KEY
from omni_serve.transport.session_prefixes import free_prefix

log = logging.getLogger("ray.serve")
ENGINE_WATCH_PERIOD_S = 1.0


@serve.deployment
class ThinkerDeployment:
    async def __init__(self, pipeline: dict[str, Any], stage_name: str = "thinker") -> None:
        config, stage, model_path = stage_setup(pipeline, stage_name)
        self.channel = edge_channel(config, stage_name, "thinker_rows")
        session_edge = find_edge(config, stage_name, "session_kv")
        self.session_kv = session_edge is not None
        kv_config = None
        if session_edge is not None:
            settings = session_edge.channel
            kv_config = channel_kv_transfer_config(settings.backend, settings.inline_max_bytes)
        self.model_config = model_config = load_config(model_path)
        self.accept_layer = model_config.talker_config.accept_hidden_layer
        self.audio_token_id = model_config.thinker_config.audio_token_id
        # For prompts whose media an encoder stage already encoded: the Thinker then takes
        # the prompt as embeddings (token embeddings with the encoder's rows spliced in).
        self.embed_tokens = load_thinker_embeddings(model_path)
        self.engine = VLLMEngine(
            str(model_path),
            stage.engine.args,
            capture_hidden=True,
            cpu_cores=stage.deployment.cpu_cores,
            kv_transfer_config=kv_config,
        )
        await self.engine.start()
        self.eos = self.engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._watchdog = asyncio.get_running_loop().create_task(self._exit_when_engine_dies())

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sampling = SamplingConfig(**request["sampling"], stop_token_ids=[self.eos])
        layers: tuple[int, ...] = ()
        if request.get("capture") and needs_captured_rows(request["prompt_ids"], self.model_config):
            layers = (0, self.accept_layer)
        prompt: dict[str, Any] = {"prompt_token_ids": request["prompt_ids"]}
        media = dict(request.get("multi_modal_data") or {})
        if request.get("audio_rows") is not None:
            prompt = {"prompt_embeds": await self._splice_audio(request)}
        if request.get("image_rows") is not None:
            media["image"] = {
                "image_embeds": await take(request["image_rows"]),
                "image_grid_thw": torch.as_tensor(request["image_grid_thw"]),
            }
        ar = ARRequest(
            request["request_id"],
            **prompt,
            multi_modal_data=media or None,
            sampling=sampling,
            capture_layers=layers,
            kv_transfer_params=self._kv_params(request, capturing=bool(layers)),
        )
        try:
            async for out in self._generate(ar, request, layers):
                yield out
        except PromptRejected as exc:  # a 400 for the client, not a stage failure
            raise StageRejectedInput(str(exc)) from None
        except Exception:
            if not self.engine.running:  # a request must not fail for a dead engine: exit
                self._exit_for_dead_engine()
            raise

    def _kv_params(self, request: dict[str, Any], capturing: bool) -> dict[str, Any] | None:
        """A session's turn exports its prompt's KV and loads the previous turn's, except when
        it captures rows for the Talker (rows of loaded tokens are never computed)."""
        offered = request.get("session_kv")
        if not self.session_kv or not request.get("session_id"):
            free_prefix(offered)
            return None
        params: dict[str, Any] = {EXPORT_KEY: True}
        if offered and not capturing:
            params[PREFIX_KEY] = offered
        else:
            free_prefix(offered)
        return params

    async def _generate(
        self, ar: ARRequest, request: dict[str, Any], layers: tuple[int, ...]
    ) -> AsyncIterator[dict[str, Any]]:
        n_prompt = len(request["prompt_ids"])
        by_embeds = ar.prompt_embeds is not None
        rows: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
        sent_rows = False
        async for chunk in self.engine.generate(ar):
            out = {
                "token_ids": chunk.token_ids,
                "text": chunk.text,
                "finished": chunk.finished,
                "finish_reason": chunk.finish_reason,
                "num_prompt_tokens": chunk.num_prompt_tokens,
                "num_cached_tokens": chunk.num_cached_tokens,
                # vLLM has no real ids for an embeddings prompt; the caller's ids stand.
                "prompt_token_ids": None if by_embeds else chunk.prompt_token_ids,
            }
            if chunk.kv_transfer_params:
                out["session_kv"] = chunk.kv_transfer_params.get(PREFIX_KEY)
            for k, v in chunk.hidden.items():
                rows[k].append(v)
            if request.get("capture") and not layers and not sent_rows:
                out["prompt_rows"] = TOKEN_EMBEDDINGS  # no media: the Talker looks them up
                sent_rows = True
            if layers and not sent_rows:
                have = sum(v.shape[0] for v in rows[0])
                if have >= chunk.num_prompt_tokens or chunk.finished:
                    full = {
                        k: torch.cat(v)[: chunk.num_prompt_tokens or n_prompt]
                        for k, v in rows.items()
                    }
                    out["prompt_rows"] = self.channel.put(full)
                    sent_rows = True
            yield out

    async def _splice_audio(self, request: dict[str, Any]) -> torch.Tensor:
        rows = await take(request["audio_rows"])
        ids = torch.tensor(request["prompt_ids"])
        slots = ids == self.audio_token_id
        if int(slots.sum()) != rows.shape[0]:
            raise ValueError(f"{int(slots.sum())} audio positions but {rows.shape[0]} encoder rows")
        embeds = self.embed_tokens[ids].clone()
        embeds[slots] = rows.to(embeds.dtype)
        return embeds

    async def _exit_when_engine_dies(self) -> None:
        """vLLM runs its engine in child processes; when one dies (OOM-killed, say) this replica
        can never serve again. Exiting at once lets Serve replace it now and makes callers see a
        dead replica, which they retry on the replacement, instead of every request failing
        with EngineDeadError until Serve's health checks notice (~25 s, measured)."""
        while self.engine.running:
            await asyncio.sleep(ENGINE_WATCH_PERIOD_S)
        self._exit_for_dead_engine()

    def _exit_for_dead_engine(self) -> None:
        log.error("the Thinker's vLLM engine died; exiting so that Serve replaces this replica")
        logging.shutdown()
        os._exit(1)

    async def check_health(self) -> None:
        if not self.engine.running:
            raise RuntimeError("vLLM engine is not running")

    async def ready(self) -> bool:
        return self.engine.running
