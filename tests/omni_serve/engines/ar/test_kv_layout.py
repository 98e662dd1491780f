"""Unpacking exported KV blocks into keys and values (what a stage attending to an AR stage's
KV reads); the integration tier checks CPU_ATTN's result against transformers' own cache, the
GPU backends are checked here against vLLM's own cache views (no GPU engine runs here)."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.kv_layout import CONTENT_SPLIT_BACKENDS, dense_kv
from omni_serve.transport.kv_blocks import gather_into


def cpu_vec_blocks(keys: torch.Tensor, values: torch.Tensor, block_size: int) -> torch.Tensor:
    """Pack [tokens, heads, head_size] K and V the way vLLM's CPU "vec" kernel stores them:
    per block and head, K transposed then V."""
    tokens, heads, head_size = keys.shape
    blocks = tokens // block_size
    k = keys.reshape(blocks, block_size, heads, head_size).permute(0, 2, 3, 1)  # [B, H, D, bs]
    v = values.reshape(blocks, block_size, heads, head_size).transpose(1, 2)  # [B, H, bs, D]
    packed = torch.cat([k.reshape(blocks, heads, -1), v.reshape(blocks, heads, -1)], dim=-1)
    return packed.reshape(blocks, heads, block_size, 2 * head_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_vec_blocks_unpack_to_the_keys_and_values_packed(dtype):
    keys = torch.randn(3 * 32, 2, 16).to(dtype)
    values = torch.randn(3 * 32, 2, 16).to(dtype)
    blocks = {
        "layer.0": cpu_vec_blocks(keys, values, 32),
        "layer.1": cpu_vec_blocks(values, keys, 32),
    }
    out = dense_kv(blocks, "CPU_ATTN/vec")
    assert torch.equal(out["layer.0"][0], keys) and torch.equal(out["layer.0"][1], values)
    assert torch.equal(out["layer.1"][0], values) and torch.equal(out["layer.1"][1], keys)


def paged_caches(
    layout_name: str,
    layers: int,
    num_blocks: int,
    block_size: int,
    heads: int,
    head_size: int,
    dtype: torch.dtype,
    kernel_block_size: int | None = None,
) -> dict[str, torch.Tensor]:
    """Per-layer caches as a vLLM GPU worker allocates them: one buffer, viewed by vLLM's own
    ``create_kv_cache_views`` as logical [blocks, heads, block_size, 2 * head_size] per layer
    in the physical ``layout_name`` order (with ``kernel_block_size``: [blocks * r, heads,
    kernel_block_size, 2 * head_size], what a worker whose kernels take smaller blocks gets)."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    layout = KVCacheLayout[layout_name]
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )
    strides = compute_layout_strides(spec, num_blocks, layers, layout)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    size = layers * num_blocks * spec.page_size_bytes
    tensor = KVCacheTensor(
        size=size, layers=names, layer_stride=strides[0], block_stride=strides[1]
    )
    raw = torch.zeros(size, dtype=torch.int8)
    views = create_kv_cache_views(
        raw, spec, num_blocks, layout, tensor, kernel_block_size=kernel_block_size
    )
    return dict(zip(names, views, strict=True))


@pytest.mark.parametrize("backend", CONTENT_SPLIT_BACKENDS)
@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"])
def test_gpu_backend_blocks_exported_then_read_give_the_keys_and_values_written(backend, layout):
    pytest.importorskip("vllm")
    block_size, heads, head_size, block_ids = 4, 2, 8, [5, 1, 3]
    caches = paged_caches(layout, 2, 7, block_size, heads, head_size, torch.bfloat16)
    tokens = len(block_ids) * block_size
    written = {}
    for i, (name, cache) in enumerate(caches.items()):
        keys = torch.randn(tokens, heads, head_size).to(torch.bfloat16) + i
        values = torch.randn(tokens, heads, head_size).to(torch.bfloat16) - i
        # Where these backends' kernels write: their forward's own view of the cache.
        key_cache, value_cache = cache.transpose(1, 2).split(head_size, dim=-1)
        for slot, block in enumerate(block_ids):
            span = slice(slot * block_size, (slot + 1) * block_size)
            key_cache[block], value_cache[block] = keys[span], values[span]
        written[name] = keys, values
    # The connector's export: blocks gathered through the views, block dim first.
    dims = dict.fromkeys(caches, 0)  # the connector's: blocks first
    out = {
        name: torch.empty(len(block_ids), *cache.shape[1:], dtype=cache.dtype)
        for name, cache in caches.items()
    }
    gather_into(out, caches, dims, block_ids)
    dense = dense_kv(out, f"{backend}/{layout}")
    for name, (keys, values) in written.items():
        assert torch.equal(dense[name][0], keys) and torch.equal(dense[name][1], values)


@pytest.mark.parametrize(
    "layout", ["", "CPU_ATTN/amx", "FLASH_ATTN", "FLASH_ATTN/LBNHC/fp8", "ROCM_ATTN/LBNHC"]
)
def test_a_layout_without_a_reader_is_refused_by_name(layout):
    with pytest.raises(ValueError, match="no reader for KV layout"):
        dense_kv({"layer.0": torch.zeros(1, 2, 32, 32)}, layout)


@pytest.mark.parametrize(
    ("cache_dtype", "expected"), [("auto", "FLASH_ATTN/LBNHC"), ("fp8", "FLASH_ATTN/LBNHC/fp8")]
)
def test_a_quantized_cache_names_its_dtype_so_none_reads_it(monkeypatch, cache_dtype, expected):
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    from vllm.distributed.kv_transfer.kv_connector import utils
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from omni_serve.engines.ar.kv_layout import cache_layout

    backend = NS(get_name=lambda: "FLASH_ATTN")
    monkeypatch.setattr(utils, "get_current_attn_backend", lambda config: backend)
    config = NS(
        cache_config=NS(
            cache_dtype=cache_dtype, get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC
        )
    )
    assert cache_layout(config) == expected
    if cache_dtype != "auto":
        with pytest.raises(ValueError, match="no reader"):
            dense_kv({"layer.0": torch.zeros(1, 2, 4, 16)}, expected)


def write_through_kernel_blocks(
    cache: torch.Tensor, block_ids: list[int], split: int, keys: torch.Tensor, values: torch.Tensor
) -> None:
    """Where a backend's kernels write a prefix in a cache of kernel blocks: token t of block
    b in kernel block b * split + t // kernel_block (vLLM's ``map_to_kernel_block_table``)."""
    kernel_block, head_size = cache.shape[2], keys.shape[-1]
    key_cache, value_cache = cache.transpose(1, 2).split(head_size, dim=-1)
    for slot, block in enumerate(block_ids):
        for j in range(split):
            span = slice((slot * split + j) * kernel_block, (slot * split + j + 1) * kernel_block)
            key_cache[block * split + j], value_cache[block * split + j] = keys[span], values[span]


@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASH_ATTN"])
@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])  # the layouts vLLM splits
def test_kernel_block_caches_export_the_blocks_a_reader_and_another_engine_take(backend, layout):
    """A worker whose kernels take 4-token blocks under 8-token manager blocks (FlashInfer at a
    large --block-size): the connector takes its views, the export reads back as the keys and
    values written, and another such engine scatters them where its kernels look."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from omni_serve.engines.ar.kv_connector import ChannelKVConnector
    from omni_serve.transport.kv_blocks import scatter

    block_size, kernel_block, heads, head_size, num_blocks = 8, 4, 2, 8, 7
    split, block_ids, target_ids = block_size // kernel_block, [5, 1, 3], [0, 6, 2]

    def worker(caches: dict[str, torch.Tensor]) -> ChannelKVConnector:
        config = NS(
            kv_transfer_config=NS(get_from_extra_config=lambda key, default: default),
            cache_config=NS(block_size=block_size),
            parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1),
        )
        connector = ChannelKVConnector(config, KVConnectorRole.WORKER, NS(num_blocks=num_blocks))
        connector.register_kv_caches(caches)
        return connector

    def caches() -> dict[str, torch.Tensor]:
        made = paged_caches(
            layout,
            2,
            num_blocks,
            block_size,
            heads,
            head_size,
            torch.bfloat16,
            kernel_block_size=kernel_block,
        )
        assert next(iter(made.values())).shape[:3] == (num_blocks * split, heads, kernel_block)
        return made

    source, target = caches(), caches()
    tokens, written = len(block_ids) * block_size, {}
    for i, (name, cache) in enumerate(source.items()):
        keys = torch.randn(tokens, heads, head_size).to(torch.bfloat16) + i
        values = torch.randn(tokens, heads, head_size).to(torch.bfloat16) - i
        write_through_kernel_blocks(cache, block_ids, split, keys, values)
        written[name] = keys, values
    exporter = worker(source)
    out = {
        name: torch.empty(len(block_ids), *cache.shape[1:], dtype=cache.dtype)
        for name, cache in exporter._caches.items()
    }
    gather_into(out, exporter._caches, exporter._dims, block_ids)
    dense = dense_kv(out, f"{backend}/{layout}")
    importer = worker(target)
    scatter(out, importer._caches, importer._dims, target_ids)
    for name, (keys, values) in written.items():
        assert torch.equal(dense[name][0], keys) and torch.equal(dense[name][1], values)
        expected = torch.zeros_like(target[name])
        write_through_kernel_blocks(expected, target_ids, split, keys, values)
        assert torch.equal(target[name], expected)
