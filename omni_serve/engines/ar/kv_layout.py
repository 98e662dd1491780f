"""Where a vLLM engine keeps K and V inside its cache blocks, and reading them back out.

Engine to engine, exported blocks move as opaque bytes: the receiver is the same model on the
same attention backend, so it scatters them into its cache as they are (the connector checks
that the layouts match). A stage that attends to an AR stage's KV instead (a DiT conditioned on
the Thinker's cache) needs the keys and values themselves: ``dense_kv`` unpacks exported blocks
into per-layer [tokens, kv_heads, head_size] tensors, the shape vLLM's own attention takes them
in. A layout gets a reader only where a test checks it against the engine's own code: CPU_ATTN
"vec" against transformers' cache through a real engine (tests/integration/
test_kv_prefix_transfer.py), the GPU backends that pack K and V along the content dim against
vLLM's own cache views and those backends' own K/V split (tests/omni_serve/engines/ar/
test_kv_layout.py; no GPU engine ran). Any other layout, and every quantized cache (its values
need scales the blocks do not carry), is refused by name rather than unpacked by guess.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

LayerKV = tuple[torch.Tensor, torch.Tensor]


def cache_layout(vllm_config: VllmConfig) -> str:
    """``"<attention backend>/<block format>[/<cache dtype>]"``, e.g. ``"CPU_ATTN/vec"`` or
    ``"FLASH_ATTN/LBNHC/fp8"`` (a quantized cache names its dtype); "" if unknown."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backend

        backend = get_current_attn_backend(vllm_config).get_name()
    except Exception as exc:  # noqa: BLE001 - a layout we cannot name is just not checked
        logger.warning("KV cache layout unknown (%s): exported blocks carry none", exc)
        return ""
    if backend == "CPU_ATTN":
        layout = f"{backend}/{_cpu_isa(vllm_config)}"
    else:
        resolve = getattr(vllm_config.cache_config, "get_resolved_kv_cache_layout", None)
        layout = f"{backend}/{resolve().name}" if resolve else backend
    cache_dtype = vllm_config.cache_config.cache_dtype
    return layout if not _quantized(cache_dtype) else f"{layout}/{cache_dtype}"


def _quantized(cache_dtype: str) -> bool:
    from vllm.utils.torch_utils import is_quantized_kv_cache

    return is_quantized_kv_cache(cache_dtype)


def _cpu_isa(vllm_config: VllmConfig) -> str:
    """The CPU backend's kernel family, which decides how a block packs K (vLLM 0.32: chosen
    by the private ``cpu_attn._get_attn_isa`` from dtype, block and head size; no public
    accessor before the layers exist)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:
        return "unknown"
    model, cache = vllm_config.model_config, vllm_config.cache_config
    return _get_attn_isa(model.dtype, cache.block_size, model.get_head_size(), cache.cache_dtype)


def _cpu_vec(blocks: torch.Tensor) -> LayerKV:
    """CPU_ATTN's "vec" blocks, [blocks, heads, block_size, 2 * head_size]: per block and head
    the first half holds K transposed ([head_size, block_size]), the second V
    ([block_size, head_size])."""
    num_blocks, heads, block_size, twice = blocks.shape
    head_size = twice // 2
    halves = blocks.reshape(num_blocks, heads, 2, block_size * head_size)
    keys = halves[:, :, 0].reshape(num_blocks, heads, head_size, block_size).permute(0, 3, 1, 2)
    values = halves[:, :, 1].reshape(num_blocks, heads, block_size, head_size).transpose(1, 2)
    tokens = num_blocks * block_size
    return keys.reshape(tokens, heads, head_size), values.reshape(tokens, heads, head_size)


def _content_split(blocks: torch.Tensor) -> LayerKV:
    """vLLM's logical per-layer block, [blocks, heads, block_size, 2 * head_size], with K and V
    side by side along the last dim (these backends' forward: ``kv_cache.transpose(1, 2)
    .split(head_size, dim=-1)``); or, from a cache split into kernel blocks, [blocks, r,
    heads, block_size / r, 2 * head_size], kernel block j holding the block's j-th run of
    tokens."""
    if blocks.dim() == 5:
        num_blocks, split, heads, kernel_block, content = blocks.shape
        blocks = blocks.transpose(1, 2).reshape(num_blocks, heads, split * kernel_block, content)
    num_blocks, heads, block_size, twice = blocks.shape
    keys, values = blocks.transpose(1, 2).split(twice // 2, dim=-1)
    tokens = num_blocks * block_size
    return keys.reshape(tokens, heads, -1), values.reshape(tokens, heads, -1)


READERS: dict[str, Callable[[torch.Tensor], LayerKV]] = {"CPU_ATTN/vec": _cpu_vec}
# Backends whose blocks ``_content_split`` reads whatever their physical layout (NHD, HND,
# block-outermost, ...): vLLM 0.32 hands the connector logical [B, H, N, C] views of every
# layout, and the export gathers blocks through them, so the exported bytes are in logical
# order. A third part after the layout (a quantized cache's dtype) has no reader.
CONTENT_SPLIT_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASHINFER")


def _reader(layout: str) -> Callable[[torch.Tensor], LayerKV] | None:
    if layout in READERS:
        return READERS[layout]
    backend, _, physical = layout.partition("/")
    if backend in CONTENT_SPLIT_BACKENDS and physical and "/" not in physical:
        return _content_split
    return None


def dense_kv(blocks: dict[str, torch.Tensor], layout: str) -> dict[str, LayerKV]:
    """Per layer (K, V), each [tokens, kv_heads, head_size], from an exported prefix's blocks
    (``KVPrefix.layout`` names ``layout``). K is as the cache holds it: after the rotary
    embedding, at the prompt's positions."""
    reader = _reader(layout)
    if reader is None:
        raise ValueError(
            f"no reader for KV layout {layout or '(not recorded)'!r}; readers exist for "
            f"{sorted(READERS)} and unquantized {', '.join(CONTENT_SPLIT_BACKENDS)} caches"
        )
    return {name: reader(layer) for name, layer in blocks.items()}
