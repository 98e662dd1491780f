"""A vLLM KV connector that moves prefix KV blocks between engines over the tensor channel.

Use: engine args ``kv_transfer_config={"kv_connector": "ChannelKVConnector",
"kv_connector_module_path": "omni_serve.engines.ar.kv_connector", "kv_role": "kv_both"}``
(``kv_connector_extra_config={"channel": "direct"}`` pins a backend; default auto;
``"inline_max_bytes"``: what rides the params inline; ``vllm_engine.channel_kv_transfer_config``
builds it all).

- Export: a request whose ``kv_transfer_params`` has ``{"omni_kv_export": true}`` puts the
  whole blocks of its prompt on the channel once its prefill is done, and its final output's
  ``kv_transfer_params`` carries ``{"omni_kv": <encoded KVPrefix>}``. ``"omni_kv_channel"``
  names another backend for that export (``kv_blocks.export_backend``: this process is no Ray
  worker and cannot tell whether the cluster spans hosts).
- Import: a request whose ``kv_transfer_params`` has that ``omni_kv`` entry (on any engine of
  the same model) loads the blocks its prompt shares with the prefix instead of computing them.
  A ref is taken once (one import per export); a prefix that no longer matches, or a ref that
  is gone, costs nothing but the prefill it would have saved. One the request does not load
  (its own prefix cache holds those tokens already, or they do not match) is freed.

A prompt given as embeddings (vLLM sees no token ids or media in it) takes part when its
``kv_transfer_params`` also name its token ids (``omni_kv_prompt``) and the media items spliced
into it (``omni_kv_media``: [(offset, identity)]); without them it neither exports nor loads.

A request that captures hidden states gets rows of the tokens it computes only: one that
loads a prefix must have the loaded tokens' rows already (the Thinker keeps them per session).
An aborted request's export is freed here: its output, which would carry it, goes nowhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.v1.request import RequestStatus

from omni_serve.engines.ar.kv_layout import cache_layout
from omni_serve.transport import ChannelError, make_channel, release, take
from omni_serve.transport.kv_blocks import (
    CHANNEL_KEY,
    EXPORT_KEY,
    MEDIA_KEY,
    PREFIX_KEY,
    PROMPT_KEY,
    KVPrefix,
    put_prefix,
    scatter,
)
from omni_serve.transport.session_prefixes import free_prefix

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


@dataclass
class _Load:
    req_id: str
    prefix: KVPrefix
    block_ids: list[int]  # where the blocks go
    first: int  # index of the first of the prefix's blocks to load (the rest hit locally)


@dataclass
class _Export:
    req_id: str
    block_ids: list[int]
    token_ids: list[int]
    mm_items: list[tuple[int, str]]  # (offset, identity) of the media in its blocks
    channel: str | None = None  # the request's CHANNEL_KEY: a backend other than the engine's


@dataclass
class ChannelKVMetadata(KVConnectorMetadata):
    loads: list[_Load] = field(default_factory=list)
    exports: list[_Export] = field(default_factory=list)


@dataclass
class ChannelKVWorkerMetadata(KVConnectorWorkerMetadata):
    prefixes: dict[str, str] = field(default_factory=dict)  # req_id -> encoded KVPrefix

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, ChannelKVWorkerMetadata)
        return ChannelKVWorkerMetadata({**self.prefixes, **other.prefixes})


def _prompt(request: Any) -> list[int]:
    """The prompt's token ids; for an embeddings prompt, those its sender named (if they
    cover it exactly), else none: such a prompt neither exports nor loads."""
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    named = (request.kv_transfer_params or {}).get(PROMPT_KEY) or []
    return list(named) if len(named) == request.num_prompt_tokens else []


def _mm_items(request: Any, before: int | None = None) -> list[tuple[int, str]]:
    """(offset, identity) of the prompt's media items (those starting before ``before``):
    vLLM's identities for media it encodes, the sender's for rows spliced into an embeddings
    prompt."""
    features = getattr(request, "mm_features", None) or []
    spliced = (request.kv_transfer_params or {}).get(MEDIA_KEY) or []
    items = [(f.mm_position.offset, f.identifier) for f in features] + [tuple(i) for i in spliced]
    return sorted(
        (int(offset), str(identity))
        for offset, identity in items
        if before is None or offset < before
    )


def _run(coro: Any) -> Any:
    """Run a coroutine from the engine's synchronous step, with or without a loop here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ChannelKVConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
            # Each worker holds a shard of every block: one export would carry one shard.
            raise ValueError("ChannelKVConnector supports one worker (tensor/pipeline parallel 1)")
        self.block_size = vllm_config.cache_config.block_size
        self.layout = cache_layout(vllm_config)
        self.num_blocks = kv_cache_config.num_blocks if kv_cache_config else 0
        backend = self._kv_transfer_config.get_from_extra_config("channel", "auto")
        inline = self._kv_transfer_config.get_from_extra_config("inline_max_bytes", 64 * 1024)
        # scheduler side
        self._incoming: dict[str, tuple[KVPrefix, int, int]] = {}
        self._wanted: dict[str, Request] = {}  # exports whose prefill is not done yet
        self._block_ids: dict[str, list[int]] = {}
        self._params: dict[str, dict[str, Any]] = {}  # exported, not finished yet
        self._awaiting: dict[str, dict[str, Any]] = {}  # finished, export not back yet
        self._dropped: set[str] = set()  # aborted, export not back yet: free it on arrival
        # worker side
        worker = role == KVConnectorRole.WORKER
        self._channel = make_channel(backend, int(inline)) if worker else None
        self._inline = int(inline)
        self._named_channels: dict[str, Any] = {}  # exports that name their backend
        self._caches: dict[str, torch.Tensor] = {}
        self._dims: dict[str, int] = {}
        self._exported: dict[str, str] = {}
        self._load_errors: set[int] = set()

    # -- scheduler side ---------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        params = request.kv_transfer_params or {}
        if params.get(EXPORT_KEY) and _prompt(request):
            self._wanted[request.request_id] = request

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        encoded = (request.kv_transfer_params or {}).get(PREFIX_KEY)
        if not encoded:
            return 0, False
        try:
            prefix = KVPrefix.decode(encoded)
        except ValueError as exc:
            # The scheduler must not die for one request's bad params: it computes instead.
            logger.warning("KV prefix of %s unreadable (%s): not loaded", request.request_id, exc)
            return 0, False
        prompt = _prompt(request)
        if not prompt:  # an embeddings prompt whose token ids nobody named: nothing to match
            release(prefix.ref)
            return 0, False
        if prefix.block_size != self.block_size:
            logger.warning(
                "KV prefix of block size %d, engine uses %d: not loaded",
                prefix.block_size,
                self.block_size,
            )
            release(prefix.ref)
            return 0, False
        if prefix.layout and self.layout and prefix.layout != self.layout:
            # Same shapes can hold K and V in another order (another backend or kernel).
            logger.warning(
                "KV prefix of layout %s, engine uses %s: not loaded", prefix.layout, self.layout
            )
            release(prefix.ref)
            return 0, False
        usable = prefix.matching_tokens(prompt, _mm_items(request))
        if usable <= num_computed_tokens:
            release(prefix.ref)  # nothing to load: hand the buffer back now, not at its lease
            return 0, False
        first, last = num_computed_tokens // self.block_size, usable // self.block_size
        self._incoming[request.request_id] = (prefix, first, last)
        return usable - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens == 0 and request.request_id in self._incoming:
            release(self._incoming.pop(request.request_id)[0].ref)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = ChannelKVMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            block_ids = list(new.block_ids[0])
            if new.req_id in self._incoming:
                prefix, first, last = self._incoming.pop(new.req_id)
                meta.loads.append(_Load(new.req_id, prefix, block_ids[first:last], first))
            if new.req_id in self._wanted:
                self._block_ids[new.req_id] = block_ids
                self._export_if_done(
                    meta, new.req_id, new.num_computed_tokens + scheduled[new.req_id]
                )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in self._wanted:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                resumed = req_id in cached.resumed_req_ids
                known = [] if resumed else self._block_ids.get(req_id, [])
                self._block_ids[req_id] = known + list(new_ids[0])
            self._export_if_done(meta, req_id, cached.num_computed_tokens[i] + scheduled[req_id])
        return meta

    def _export_if_done(self, meta: ChannelKVMetadata, req_id: str, computed: int) -> None:
        request = self._wanted[req_id]
        prompt = _prompt(request)
        if computed < len(prompt):
            return  # chunked prefill: the rest of the prompt comes in a later step
        del self._wanted[req_id]
        blocks = self._block_ids.pop(req_id)[: len(prompt) // self.block_size]
        if blocks:
            tokens = len(blocks) * self.block_size
            channel = (request.kv_transfer_params or {}).get(CHANNEL_KEY)
            meta.exports.append(
                _Export(req_id, blocks, prompt, _mm_items(request, tokens), channel)
            )

    def update_connector_output(self, connector_output: Any) -> None:
        worker_meta = connector_output.kv_connector_worker_meta
        if not isinstance(worker_meta, ChannelKVWorkerMetadata):
            return
        for req_id, encoded in worker_meta.prefixes.items():
            value = encoded or None  # "" = the export failed
            if req_id in self._dropped:
                self._dropped.discard(req_id)
                free_prefix(value)
                continue
            if req_id in self._awaiting:
                # It finished in its prefill step and handed this dict to its output, which
                # leaves the engine after this call: filled in place.
                self._awaiting.pop(req_id)[PREFIX_KEY] = value
            else:
                self._params[req_id] = {PREFIX_KEY: value}

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        unloaded = self._incoming.pop(req_id, None)  # ended before its load was scheduled
        if unloaded is not None:
            release(unloaded[0].ref)
        if self._wanted.pop(req_id, None) is not None:  # ended before its prefill did
            self._block_ids.pop(req_id, None)
            return False, {PREFIX_KEY: None}
        if not (request.kv_transfer_params or {}).get(EXPORT_KEY):
            return False, None
        params = self._params.pop(req_id, None)
        if request.status == RequestStatus.FINISHED_ABORTED:
            # Its output goes nowhere (the caller aborted): the export would wait out its lease.
            if params is None:
                self._dropped.add(req_id)
            else:
                free_prefix(params.get(PREFIX_KEY))
            return False, None
        if params is None:
            params = self._awaiting[req_id] = {}
        return False, params

    # -- worker side ------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM 0.32 hands connectors [blocks, heads, block_size, content] views whatever the
        physical layout (``create_kv_cache_views``), or, where the attention kernels take
        smaller blocks than the manager's (FlashInfer at ``--block-size`` 128, say),
        [blocks * r, heads, block_size / r, content] kernel-block views, kernel block j of
        block b at b * r + j (vLLM's ``map_to_kernel_block_table``). Those are kept as
        [blocks, r, heads, block_size / r, content], so that block ids index dim 0 either
        way. Any other shape is refused: the engine says so at start instead of exporting
        garbage."""
        views = {}
        for name, cache in kv_caches.items():
            split = cache.shape[0] // max(self.num_blocks, 1) if cache.dim() == 4 else 0
            if (
                split < 1
                or cache.shape[0] != split * self.num_blocks
                or (cache.shape[2] * split != self.block_size)
            ):
                raise ValueError(
                    f"ChannelKVConnector: the KV cache of {name} is {tuple(cache.shape)}, not "
                    f"[{self.num_blocks} blocks (or kernel blocks of a {self.block_size}-token "
                    "block), heads, tokens, content]: not supported"
                )
            views[name] = cache if split == 1 else cache.unflatten(0, (self.num_blocks, split))
        self._caches = views
        self._dims = dict.fromkeys(views, 0)  # blocks first, as checked above

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, ChannelKVMetadata)
        for load in meta.loads:
            try:
                blocks = _run(take(load.prefix.ref))
                scatter(blocks, self._caches, self._dims, load.block_ids, load.first)
            except (ChannelError, ValueError, RuntimeError) as exc:
                # vLLM recomputes the tokens of blocks reported here.
                logger.warning("KV prefix for %s not loaded (%s): recomputing", load.req_id, exc)
                self._load_errors.update(load.block_ids)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are synchronous, before the forward

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # exports copy whole blocks after the forward (wait_for_save)

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, ChannelKVMetadata)
        for export in meta.exports:
            try:
                prefix = put_prefix(
                    self._export_channel(export.channel),
                    self._caches,
                    self._dims,
                    export.block_ids,
                    export.token_ids,
                    self.block_size,
                    export.mm_items,
                    self.layout,
                )
            except (ChannelError, OSError, RuntimeError, ValueError) as exc:  # still answers
                logger.warning("KV prefix of %s not exported: %s", export.req_id, exc)
                self._exported[export.req_id] = ""
                continue
            self._exported[export.req_id] = prefix.encode()

    def _export_channel(self, name: str | None) -> Any:
        """The engine's channel, or the one an export names (ValueError: no such backend)."""
        if name is None:
            return self._channel
        if name not in self._named_channels:
            self._named_channels[name] = make_channel(name, self._inline)
        return self._named_channels[name]

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if not self._exported:
            return None
        meta, self._exported = ChannelKVWorkerMetadata(self._exported), {}
        return meta

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors
