"""Thinker stage: vLLM AsyncLLM, streaming tokens; the prompt's hidden rows go on the tensor
channel and only their reference rides the stream. With a ``session_kv`` edge (thinker ->
thinker) a session's turns hand their prompt's KV blocks to the next turn over the channel."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import torch
from ray import serve

from deployments.common import (
    ReleasesSharedMemory,
    edge_channel,
    export_stage_metrics,
    find_edge,
    stage_setup,
)
from omni_serve.api.errors import StageRejectedInput
from omni_serve.engines.ar.base import ARChunk, ARRequest, PromptRejected
from omni_serve.engines.ar.vllm_engine import VLLMEngine, channel_kv_transfer_config
from omni_serve.models.registry import thinker_talker_family
from omni_serve.models.thinker_talker.messages import (
    TOKEN_EMBEDDINGS,
    ThinkerChunk,
    ThinkerRequest,
    reply_rows,
    to_wire,
)
from omni_serve.models.thinker_talker.thinker_inputs import engine_inputs
from omni_serve.models.thinker_talker.thinker_turns import ThinkerTurns, Turn
from omni_serve.transport import channel_stats, release
from omni_serve.transport.kv_blocks import PREFIX_KEY
from omni_serve.transport.stats import merged

log = logging.getLogger("ray.serve")
ENGINE_WATCH_PERIOD_S = 1.0


@serve.deployment
class ThinkerDeployment(ReleasesSharedMemory):
    async def __init__(self, pipeline: dict[str, Any], stage_name: str = "thinker") -> None:
        config, stage, model_path = stage_setup(pipeline, stage_name)
        session_edge = find_edge(config, stage_name, "session_kv")
        kv_config = None
        if session_edge is not None:
            settings = session_edge.channel
            kv_config = channel_kv_transfer_config(settings.backend, settings.inline_max_bytes)
        self.model = model = thinker_talker_family(config.family).thinker_model(model_path)
        self.audio_token_id = model.placeholders["audio"]
        self.merge_size = model.merge_size
        # For prompts whose media an encoder stage already encoded: the Thinker then takes
        # the prompt as embeddings (token embeddings with the encoder's rows spliced in).
        self.embed_tokens = model.embed_tokens
        self.turns = ThinkerTurns(
            edge_channel(config, stage_name, "thinker_rows"),
            edge_channel(config, stage_name, "session_kv") if session_edge else None,
            self.embed_tokens,
            model.accept_layer,
            model.placeholders,
            everywhere=model.reply_layer is not None,
        )
        self.engine = VLLMEngine(
            str(model_path),
            stage.engine.vllm_args(),
            capture_hidden=True,
            cpu_cores=stage.deployment.cpu_cores,
            kv_transfer_config=kv_config,
        )
        await self.engine.start()
        self.eos = self.engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self._watchdog = asyncio.get_running_loop().create_task(self._exit_when_engine_dies())
        self.metrics_export = export_stage_metrics(stage_name, self.stats)

    async def generate(self, request: ThinkerRequest) -> AsyncIterator[list[Any]]:
        """``ThinkerChunk``s in their wire form (``messages.to_wire``)."""
        sampling = dataclasses.replace(request.sampling)
        if not sampling.ignore_eos:  # vLLM's ignore_eos passes over stop_token_ids' too
            sampling.stop_token_ids = [self.eos]
        layers = self.model.capture_layers(request.prompt_ids) if request.capture else ()
        turn = Turn(capturing=bool(layers))
        try:
            request = self.turns.take_session_rows(request, turn)
            inputs = await engine_inputs(
                request, self.embed_tokens, self.audio_token_id, self.merge_size
            )
            if layers and self.turns.hands_over_kv and request.session_id:
                turn.media = inputs.media_digests(self.merge_size)
            # A spoken turn reads caches only where the previous one's rows can stand in.
            reuse = turn.capturing and turn.kept is not None
            capturing = turn.capturing and not reuse
            kv_params = self.turns.kv_params(request, capturing, inputs.spliced)
            ar = ARRequest(
                request.request_id,
                **inputs.prompt,
                multi_modal_data=inputs.multi_modal_data or None,
                mm_processor_kwargs=request.mm_processor_kwargs,
                sampling=sampling,
                capture_layers=layers,
                kv_transfer_params=kv_params,
                read_cache=True if reuse else None,
            )
            async for out in self._generate(ar, request, layers, turn):
                yield to_wire(out)
        except PromptRejected as exc:  # a 400 for the client, not a stage failure
            raise StageRejectedInput(str(exc)) from None
        except Exception:
            if not self.engine.running:  # a request must not fail for a dead engine: exit
                self._exit_for_dead_engine()
            raise
        finally:
            release(*turn.unhanded())

    async def _generate(
        self, ar: ARRequest, request: ThinkerRequest, layers: tuple[int, ...], turn: Turn
    ) -> AsyncIterator[ThinkerChunk]:
        by_embeds = ar.prompt_embeds is not None
        rows: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
        sent_rows = False
        reply_layer = self.model.reply_layer if layers else None
        seen = None  # positions of ``reply_layer``'s rows so far: cached ones, then captured
        reply: list[int] = []
        async with contextlib.aclosing(self.engine.generate(ar)) as chunks:
            async for chunk in chunks:
                # The prompt as the engine ran it (placeholders expanded; an embeddings prompt
                # came expanded, and vLLM has no real ids for it).
                ids = list(request.prompt_ids) if by_embeds else chunk.prompt_token_ids
                turn.ids = turn.ids or ids or []
                checked = layers and not sent_rows and ar.read_cache and chunk.num_cached_tokens
                if checked and not await self.turns.read_kept_rows(turn, chunk.num_cached_tokens):
                    turn.ids = []
                    break  # no kept rows for the cached media: run without caches
                out = _thinker_chunk(chunk, by_embeds)
                reply += chunk.token_ids
                for k, v in chunk.hidden.items():
                    rows[k].append(v)
                if reply_layer is not None and reply_layer in chunk.hidden:
                    new = chunk.hidden[reply_layer]
                    seen = chunk.num_cached_tokens if seen is None else seen  # never captured
                    out.reply_rows = reply_rows(new, seen, len(turn.ids))
                    seen += new.shape[0]
                if request.capture and not layers and not sent_rows:
                    out.prompt_rows = TOKEN_EMBEDDINGS  # no media: the Talker looks them up
                    sent_rows = True
                if layers and not sent_rows:
                    cached, finished = chunk.num_cached_tokens, chunk.finished
                    out.prompt_rows = self.turns.prompt_rows(rows, cached, finished, turn)
                    sent_rows = out.prompt_rows is not None
                if chunk.kv_transfer_params:  # the last chunk
                    self.turns.keep_reply(turn, rows, chunk.num_cached_tokens, reply)
                    prefix = chunk.kv_transfer_params.get(PREFIX_KEY)
                    out.session_kv = self.turns.with_rows(prefix, turn)
                yield out
                if chunk.finished:
                    return
        log.info("request %s: cached media without kept rows; rerunning", ar.request_id)
        params = {k: v for k, v in (ar.kv_transfer_params or {}).items() if k != PREFIX_KEY}
        rerun = dataclasses.replace(
            ar,
            request_id=f"{ar.request_id}-uncached",
            read_cache=False,
            kv_transfer_params=params or None,
        )
        async for out in self._generate(rerun, request, layers, turn):
            yield out

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

    def __del__(self) -> None:
        """Serve calls this when it stops the replica gracefully (Ctrl-C on ``serve run``,
        a scale-down, a redeploy). Without it vLLM's processes die with the replica and leave
        their shared-memory queues in /dev/shm: two ``psm_*`` files of 160 and 240 MB
        (sparse) per replica, each time."""
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.cancel()  # the engine stopping now is no engine death
        if getattr(self, "engine", None) is not None:
            self.engine.close()
        super().__del__()

    async def check_health(self) -> None:
        if not self.engine.running:
            raise RuntimeError("vLLM engine is not running")

    async def stats(self) -> dict[str, Any]:
        """The channel only, for the ingress's /metrics (the engine's own numbers are vLLM's):
        this replica's and its engine worker's, where KV blocks are exported and loaded."""
        return {"channel": merged(channel_stats(), await self.engine.channel_stats())}

    async def ready(self) -> bool:
        return self.engine.running


def _thinker_chunk(chunk: ARChunk, by_embeds: bool) -> ThinkerChunk:
    return ThinkerChunk(
        chunk.token_ids,
        chunk.text,
        chunk.finished,
        chunk.finish_reason,
        chunk.stop_tokens,
        chunk.num_prompt_tokens,
        chunk.num_cached_tokens,
        # vLLM has no real ids for an embeddings prompt; the caller's ids stand.
        prompt_token_ids=None if by_embeds else chunk.prompt_token_ids,
    )
