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
from dataclasses import dataclass, field
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
from omni_serve.engines.ar.base import ARRequest, PromptRejected, SamplingConfig
from omni_serve.engines.ar.vllm_engine import VLLMEngine, channel_kv_transfer_config
from omni_serve.models.qwen3_omni.checkpoint import load_config, load_thinker_embeddings
from omni_serve.models.qwen3_omni.media_payload import media_from_payload
from omni_serve.models.qwen3_omni.session_rows import (
    SessionRows,
    assemble,
    covers,
    media_digests,
    rows_to_keep,
)
from omni_serve.models.qwen3_omni.talker_inputs import (
    TOKEN_EMBEDDINGS,
    media_token_ids,
    needs_captured_rows,
)
from omni_serve.models.qwen3_omni.thinker_inputs import splice_rows, video_embeds_input
from omni_serve.transport import ChannelError, TensorRef, channel_stats, release, take
from omni_serve.transport.base import cat_into, put_in_place
from omni_serve.transport.kv_blocks import (
    CHANNEL_KEY,
    EXPORT_KEY,
    MEDIA_KEY,
    PREFIX_KEY,
    PROMPT_KEY,
    export_backend,
)
from omni_serve.transport.session_prefixes import decode_prefix, free_prefix
from omni_serve.transport.stats import merged

log = logging.getLogger("ray.serve")
ENGINE_WATCH_PERIOD_S = 1.0


@dataclass
class _Turn:
    """A turn's session rows: those handed to it (``kept``) and those it keeps (``new``);
    whatever it neither read nor handed on is freed when the turn ends."""

    capturing: bool
    kept: SessionRows | None = None
    kept_taken: bool = False  # read (or found gone): freed, not to be handed on
    kept_rows: torch.Tensor | None = None
    new: SessionRows | None = None
    handed: SessionRows | None = None
    media: dict[str, list[str]] | None = None  # its media digests (a session's spoken turn)
    ids: list[int] = field(default_factory=list)  # the prompt as the engine ran it

    def unhanded(self) -> list[TensorRef]:
        left = [] if self.kept is None or self.kept_taken else [self.kept]
        left += [] if self.new is None else [self.new]
        return [rows.ref for rows in left if rows is not self.handed]


@serve.deployment
class ThinkerDeployment(ReleasesSharedMemory):
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
        modalities = ("audio", "image", "video")
        self.placeholders = dict(zip(modalities, media_token_ids(model_config), strict=True))
        self.merge_size = model_config.thinker_config.vision_config.spatial_merge_size
        self.session_channel = edge_channel(config, stage_name, "session_kv")
        # For prompts whose media an encoder stage already encoded: the Thinker then takes
        # the prompt as embeddings (token embeddings with the encoder's rows spliced in).
        self.embed_tokens = load_thinker_embeddings(model_path)
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

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sampling = SamplingConfig(**request["sampling"])
        if not sampling.ignore_eos:  # vLLM's ignore_eos passes over stop_token_ids' too
            sampling.stop_token_ids = [self.eos]
        layers: tuple[int, ...] = ()
        if request.get("capture") and needs_captured_rows(request["prompt_ids"], self.model_config):
            layers = (0, self.accept_layer)
        turn = _Turn(capturing=bool(layers))
        try:
            request = self._take_session_rows(request, turn)
            prompt: dict[str, Any] = {"prompt_token_ids": request["prompt_ids"]}
            raw: dict[str, Any] = {}  # media vLLM encodes here, sent on the channel
            if request.get("media") is not None:
                shipped = request["media"]
                raw = media_from_payload(await take(shipped["ref"]), shipped["layout"])
            media = dict(raw)
            spliced: list[tuple[int, str]] | None = None
            if request.get("audio_rows") is not None:
                rows = await take(request["audio_rows"])
                embeds, spliced = splice_rows(
                    self.embed_tokens, request["prompt_ids"], rows, self.audio_token_id
                )
                prompt = {"prompt_embeds": embeds}
            encoded: dict[str, tuple[torch.Tensor, Any]] = {}  # by the encoder stage
            if request.get("image_rows") is not None:
                grid = request["image_grid_thw"]
                encoded["image"] = (await take(request["image_rows"]), grid)
                media["image"] = {"image_embeds": encoded["image"][0],
                                  "image_grid_thw": torch.as_tensor(grid)}  # fmt: skip
            if request.get("video_rows") is not None:
                grid = request["video_grid_thw"]
                encoded["video"] = (await take(request["video_rows"]), grid)
                media["video"] = video_embeds_input(
                    encoded["video"][0], torch.as_tensor(grid), request["video_second_per_grid"]
                )
            if layers and self.session_kv and request.get("session_id"):
                turn.media = media_digests(raw, spliced, encoded, self.merge_size)
            # A spoken turn reads caches only where the previous one's rows can stand in.
            reuse = turn.capturing and turn.kept is not None
            ar = ARRequest(
                request["request_id"],
                **prompt,
                multi_modal_data=media or None,
                mm_processor_kwargs=request.get("mm_processor_kwargs"),
                sampling=sampling,
                capture_layers=layers,
                kv_transfer_params=self._kv_params(request, turn.capturing and not reuse, spliced),
                read_cache=True if reuse else None,
            )
            async for out in self._generate(ar, request, layers, turn):
                yield out
        except PromptRejected as exc:  # a 400 for the client, not a stage failure
            raise StageRejectedInput(str(exc)) from None
        except Exception:
            if not self.engine.running:  # a request must not fail for a dead engine: exit
                self._exit_for_dead_engine()
            raise
        finally:
            release(*turn.unhanded())

    def _kv_params(
        self, request: dict[str, Any], capturing: bool, spliced: list[tuple[int, str]] | None = None
    ) -> dict[str, Any] | None:
        """A session's turn exports its prompt's KV and loads the previous turn's, except when
        it captures rows for the Talker with no rows kept to stand in for cached ones (rows of
        loaded tokens are never computed). An embeddings prompt (``spliced``: the encoder
        stage's items in it) names its token ids and items, which vLLM does not see, for the
        connector to match prefixes on."""
        offered = request.get("session_kv")
        if not self.session_kv or not request.get("session_id"):
            free_prefix(offered)
            return None
        params: dict[str, Any] = {EXPORT_KEY: True}
        backend = export_backend(self.session_channel)
        if backend is not None:
            params[CHANNEL_KEY] = backend
        if spliced is not None:
            params[PROMPT_KEY], params[MEDIA_KEY] = list(request["prompt_ids"]), spliced
        if offered and not capturing:
            params[PREFIX_KEY] = offered
        else:
            free_prefix(offered)
        return params

    def _take_session_rows(self, request: dict[str, Any], turn: _Turn) -> dict[str, Any]:
        """The rows the session's last spoken turn kept ride its prefix: this turn owns them
        now (``turn.kept``); the prefix goes on without them."""
        prefix = decode_prefix(request.get("session_kv"))
        if prefix is None or prefix.companion is None:
            return request
        turn.kept = SessionRows(ref=prefix.companion, **prefix.companion_meta)
        prefix.companion, prefix.companion_meta = None, {}
        return {**request, "session_kv": prefix.encode()}

    async def _generate(
        self, ar: ARRequest, request: dict[str, Any], layers: tuple[int, ...], turn: _Turn
    ) -> AsyncIterator[dict[str, Any]]:
        by_embeds = ar.prompt_embeds is not None
        rows: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
        sent_rows = False
        async with contextlib.aclosing(self.engine.generate(ar)) as chunks:
            async for chunk in chunks:
                # The prompt as the engine ran it (placeholders expanded; an embeddings prompt
                # came expanded, and vLLM has no real ids for it).
                ids = list(request["prompt_ids"]) if by_embeds else chunk.prompt_token_ids
                turn.ids = turn.ids or ids or []
                checked = layers and not sent_rows and ar.read_cache and chunk.num_cached_tokens
                if checked and not await self._read_kept_rows(turn, chunk.num_cached_tokens):
                    turn.ids = []
                    break  # no kept rows for the cached media: run without caches
                out = {
                    "token_ids": chunk.token_ids,
                    "text": chunk.text,
                    "finished": chunk.finished,
                    "finish_reason": chunk.finish_reason,
                    "stop_tokens": chunk.stop_tokens,
                    "num_prompt_tokens": chunk.num_prompt_tokens,
                    "num_cached_tokens": chunk.num_cached_tokens,
                    # vLLM has no real ids for an embeddings prompt; the caller's ids stand.
                    "prompt_token_ids": None if by_embeds else chunk.prompt_token_ids,
                }
                for k, v in chunk.hidden.items():
                    rows[k].append(v)
                if request.get("capture") and not layers and not sent_rows:
                    out["prompt_rows"] = TOKEN_EMBEDDINGS  # no media: the Talker looks them up
                    sent_rows = True
                if layers and not sent_rows:
                    prompt_rows = await self._prompt_rows(chunk, rows, turn)
                    if prompt_rows is not None:
                        out["prompt_rows"] = prompt_rows
                        sent_rows = True
                if chunk.kv_transfer_params:  # the last chunk
                    out["session_kv"] = self._with_rows(
                        chunk.kv_transfer_params.get(PREFIX_KEY), turn
                    )
                yield out
                if chunk.finished:
                    return
        log.info("request %s: cached media without kept rows; rerunning without caches",
                 ar.request_id)  # fmt: skip
        params = {k: v for k, v in (ar.kv_transfer_params or {}).items() if k != PREFIX_KEY}
        rerun = dataclasses.replace(ar, request_id=f"{ar.request_id}-uncached", read_cache=False,
                                    kv_transfer_params=params or None)  # fmt: skip
        async for out in self._generate(rerun, request, layers, turn):
            yield out

    async def _read_kept_rows(self, turn: _Turn, cached: int) -> bool:
        """Whether the kept rows cover the cached media, read now if so (a ref that is gone,
        its producer replica having died, counts as not)."""
        if not covers(turn.kept, turn.ids, turn.media or {}, cached):
            return False
        try:
            turn.kept_rows = await take(turn.kept.ref)
        except ChannelError as exc:
            log.warning("session rows unreadable (%s)", exc)
            return False
        finally:
            turn.kept_taken = True
        return True

    async def _prompt_rows(
        self, chunk: Any, rows: dict[int, list[torch.Tensor]], turn: _Turn
    ) -> TensorRef | None:
        """A ref to the prompt's rows for the Talker once the engine has them all (kept rows
        at cached media positions, token embeddings at cached text ones), and what this turn
        keeps for the session's next spoken turn. Computed rows go straight from the engine's
        chunks into channel memory (no concatenated copy in between)."""
        cached, ids = chunk.num_cached_tokens, turn.ids
        captured = sum(v.shape[0] for v in rows[0])
        if captured < len(ids) - cached and not chunk.finished:
            return None
        if cached:
            new = torch.cat(rows[self.accept_layer])[: len(ids) - cached]
            accept = assemble(turn.kept, turn.kept_rows, new, cached)
            self._keep(turn, accept)
            return self.channel.put({0: self.embed_tokens[torch.tensor(ids)],
                                     self.accept_layer: accept})  # fmt: skip
        count = min(captured, len(ids))
        like = {
            k: torch.empty((count, v[0].shape[-1]), dtype=v[0].dtype, device="meta")
            for k, v in rows.items()
        }

        def fill(out: dict[int, torch.Tensor]) -> None:
            for k, parts in rows.items():
                cat_into(out[k], parts)
            self._keep(turn, out[self.accept_layer])  # a copy: read before the commit

        return put_in_place(self.channel, like, fill)

    def _keep(self, turn: _Turn, accept: torch.Tensor) -> None:
        """The accept-layer rows at the turn's media positions, for its session's next turn."""
        if turn.media is not None:
            keep = rows_to_keep(turn.ids, accept, self.placeholders)
            turn.new = SessionRows(
                turn.ids, turn.media, self.session_channel.put(keep), self.placeholders
            )

    @staticmethod
    def _with_rows(encoded: str | None, turn: _Turn) -> str | None:
        """The turn's export, carrying the rows for the next spoken turn: this turn's own, or
        (a turn that computed none) those it was handed, still right for what extends them."""
        companion = turn.new or (None if turn.kept_taken else turn.kept)
        prefix = decode_prefix(encoded)
        if prefix is None or companion is None:
            return encoded
        prefix.companion = companion.ref
        prefix.companion_meta = {"ids": companion.ids, "media": companion.media,
                                 "placeholders": companion.placeholders}  # fmt: skip
        turn.handed = companion
        return prefix.encode()

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
