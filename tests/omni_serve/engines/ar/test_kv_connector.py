"""The KV connector's scheduler side, step by step (what two real engines do not easily show:
chunked prefill, a request that ends early, exports that come back after the finish)."""

from __future__ import annotations

import asyncio
import base64
import pickle
from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from omni_serve.engines.ar.kv_connector import (  # noqa: E402
    ChannelKVConnector,
    ChannelKVWorkerMetadata,
)
from omni_serve.transport import ChannelError, make_channel, take  # noqa: E402
from omni_serve.transport.kv_blocks import KVPrefix  # noqa: E402

BLOCK = 4


@pytest.fixture
def connector():
    return ChannelKVConnector(_config(), KVConnectorRole.SCHEDULER, NS(num_blocks=32))


def _config(tensor_parallel: int = 1) -> NS:
    transfer = NS(get_from_extra_config=lambda key, default: default, is_kv_producer=True)
    parallel = NS(tensor_parallel_size=tensor_parallel, pipeline_parallel_size=1)
    return NS(
        kv_transfer_config=transfer, cache_config=NS(block_size=BLOCK), parallel_config=parallel
    )


def request(req_id: str, prompt: list[int], params: dict | None) -> NS:
    return NS(
        request_id=req_id,
        prompt_token_ids=prompt,
        kv_transfer_params=params,
        mm_features=[],
        status=RequestStatus.FINISHED_STOPPED,
    )


def step(new=(), cached=(), scheduled=None) -> NS:
    """A SchedulerOutput: ``new`` as (req_id, block_ids, computed), ``cached`` as
    (req_id, new_block_ids, computed)."""
    return NS(
        scheduled_new_reqs=[NS(req_id=r, block_ids=(b,), num_computed_tokens=c) for r, b, c in new],
        scheduled_cached_reqs=NS(
            req_ids=[r for r, _, _ in cached],
            resumed_req_ids=set(),
            new_block_ids=[(b,) if b is not None else None for _, b, _ in cached],
            num_computed_tokens=[c for _, _, c in cached],
        ),
        num_scheduled_tokens=scheduled or {},
    )


def test_a_chunked_prefill_exports_once_its_last_chunk_is_scheduled(connector):
    req = request("a", list(range(10)), {"omni_kv_export": True})
    connector.on_new_request(req)
    first = connector.build_connector_meta(step(new=[("a", [7, 3], 0)], scheduled={"a": 8}))
    assert first.exports == []  # 8 of 10 prompt tokens: not done
    last = connector.build_connector_meta(step(cached=[("a", [9], 8)], scheduled={"a": 2}))
    (export,) = last.exports
    assert export.block_ids == [7, 3]  # the two whole blocks; the partial third stays
    assert export.token_ids == list(range(10))
    nothing = connector.build_connector_meta(step(cached=[("a", None, 10)], scheduled={"a": 1}))
    assert nothing.exports == []  # exported once


def test_params_handed_out_before_the_export_returns_are_filled_in_place(connector):
    req = request("a", list(range(8)), {"omni_kv_export": True})
    connector.on_new_request(req)
    connector.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    _, params = connector.request_finished(req, [1, 2])  # finished in its prefill step
    assert params == {}
    connector.update_connector_output(
        NS(kv_connector_worker_meta=ChannelKVWorkerMetadata({"a": "encoded"}))
    )
    assert params == {"omni_kv": "encoded"}


def test_an_export_back_before_the_finish_goes_out_with_it(connector):
    req = request("a", list(range(8)), {"omni_kv_export": True})
    connector.on_new_request(req)
    connector.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    failed = ChannelKVWorkerMetadata({"a": ""})  # "" = the worker could not export
    connector.update_connector_output(NS(kv_connector_worker_meta=failed))
    assert connector.request_finished(req, [1, 2]) == (False, {"omni_kv": None})


def _exported(channel) -> str:
    return KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4))).encode()


@pytest.mark.parametrize("export_back", ["before_the_abort", "after_the_abort"])
def test_the_export_of_an_aborted_request_is_freed_not_left_to_its_lease(connector, export_back):
    """An aborted request's output goes nowhere (the client left, or the Thinker reran it)."""
    channel = make_channel("shared_memory")
    encoded = _exported(channel)
    req = request("a", list(range(8)), {"omni_kv_export": True})
    connector.on_new_request(req)
    connector.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    back = NS(kv_connector_worker_meta=ChannelKVWorkerMetadata({"a": encoded}))
    if export_back == "before_the_abort":
        connector.update_connector_output(back)
    req.status = RequestStatus.FINISHED_ABORTED
    assert connector.request_finished(req, [1, 2]) == (False, None)
    if export_back == "after_the_abort":
        connector.update_connector_output(back)
    with pytest.raises(ChannelError):
        asyncio.run(channel.get(KVPrefix.decode(encoded).ref))
    assert not connector._params and not connector._awaiting and not connector._dropped


def test_a_request_that_ends_before_its_prefill_exports_nothing(connector):
    req = request("a", list(range(8)), {"omni_kv_export": True})
    connector.on_new_request(req)
    connector.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 4}))
    assert connector.request_finished(req, [1, 2]) == (False, {"omni_kv": None})
    assert not connector._wanted and not connector._block_ids


def test_an_import_loads_only_what_the_local_cache_lacks(connector):
    prefix = KVPrefix(list(range(12)), BLOCK, make_channel("inline").put(torch.zeros(1)))
    req = request("b", [*range(12), 50, 51], {"omni_kv": prefix.encode()})
    assert connector.get_num_new_matched_tokens(req, 4) == (8, False)  # block 0 hit locally
    connector.update_state_after_alloc(req, None, 8)
    meta = connector.build_connector_meta(step(new=[("b", [5, 6, 7, 8], 4)], scheduled={"b": 2}))
    (load,) = meta.loads
    assert (load.block_ids, load.first) == ([6, 7], 1)


def test_no_import_for_another_block_size_or_a_covered_prefix(connector):
    other = KVPrefix(list(range(16)), 8, make_channel("inline").put(torch.zeros(1)))
    req = request("c", list(range(20)), {"omni_kv": other.encode()})
    assert connector.get_num_new_matched_tokens(req, 0) == (0, False)
    same = KVPrefix(list(range(8)), BLOCK, make_channel("inline").put(torch.zeros(1)))
    req = request("d", list(range(20)), {"omni_kv": same.encode()})
    assert connector.get_num_new_matched_tokens(req, 8) == (0, False)  # all local already


def test_no_import_of_blocks_laid_out_by_another_backend(connector):
    connector.layout = "CPU_ATTN/vec"
    channel = make_channel("shared_memory")
    other = KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4)), layout="CPU_ATTN/amx")
    req = request("h", list(range(20)), {"omni_kv": other.encode()})
    assert connector.get_num_new_matched_tokens(req, 0) == (0, False)
    with pytest.raises(ChannelError):  # handed back, not left to its lease
        asyncio.run(channel.get(other.ref))
    same = KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4)), layout="CPU_ATTN/vec")
    req = request("i", list(range(20)), {"omni_kv": same.encode()})
    assert connector.get_num_new_matched_tokens(req, 0) == (8, False)


def embeds_request(req_id: str, params: dict, length: int = 20) -> NS:
    """An embeddings prompt: vLLM holds no token ids for it."""
    return NS(
        request_id=req_id,
        prompt_token_ids=None,
        num_prompt_tokens=length,
        kv_transfer_params=params,
        mm_features=[],
    )


def test_an_embeddings_prompt_matches_on_the_ids_and_items_its_sender_named(connector):
    ids, items = list(range(20)), [[2, "rows:a"], [10, "rows:b"]]
    named = {"omni_kv_prompt": ids, "omni_kv_media": items}
    exporter = embeds_request("j", {"omni_kv_export": True, **named})
    connector.on_new_request(exporter)
    meta = connector.build_connector_meta(step(new=[("j", list(range(5)), 0)], scheduled={"j": 20}))
    (export,) = meta.exports
    assert export.token_ids == ids and export.mm_items == [(2, "rows:a"), (10, "rows:b")]

    channel = make_channel("inline")
    prefix = KVPrefix(ids[:8], BLOCK, channel.put(torch.zeros(1)), ["rows:a"], mm_offsets=[2])
    same = embeds_request("k", {"omni_kv": prefix.encode(), **named})
    assert connector.get_num_new_matched_tokens(same, 0) == (8, False)
    other = {"omni_kv_prompt": ids, "omni_kv_media": [[2, "rows:c"], [10, "rows:b"]]}
    assert connector.get_num_new_matched_tokens(
        embeds_request("l", {"omni_kv": prefix.encode(), **other}), 0
    ) == (0, False)  # same placeholder ids, other audio


def test_an_embeddings_prompt_without_its_ids_neither_exports_nor_loads(connector):
    connector.on_new_request(embeds_request("m", {"omni_kv_export": True}))
    assert not connector._wanted
    channel = make_channel("shared_memory")
    prefix = KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4)))
    wrong_length = {"omni_kv": prefix.encode(), "omni_kv_prompt": list(range(19))}
    assert connector.get_num_new_matched_tokens(embeds_request("n", wrong_length), 0) == (0, False)
    with pytest.raises(ChannelError):  # handed back at once
        asyncio.run(channel.get(prefix.ref))


NOT_A_PREFIX = base64.b64encode(pickle.dumps({"token_ids": [1]})).decode()


@pytest.mark.parametrize("bad", ["not base64!", "aGVsbG8=", 42, NOT_A_PREFIX])
def test_unreadable_prefix_params_compute_instead_of_failing_the_scheduler(connector, bad):
    req = request("e", list(range(20)), {"omni_kv": bad})
    assert connector.get_num_new_matched_tokens(req, 0) == (0, False)


def test_a_prefix_the_local_cache_covers_is_freed_not_left_to_its_lease(connector):
    channel = make_channel("shared_memory")
    prefix = KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4)))
    req = request("f", list(range(20)), {"omni_kv": prefix.encode()})
    assert connector.get_num_new_matched_tokens(req, 8) == (0, False)
    with pytest.raises(ChannelError):
        asyncio.run(channel.get(prefix.ref))


def test_a_prefix_whose_request_ends_before_loading_is_freed(connector):
    channel = make_channel("shared_memory")
    prefix = KVPrefix(list(range(8)), BLOCK, channel.put(torch.zeros(4)))
    req = request("g", list(range(20)), {"omni_kv": prefix.encode()})
    assert connector.get_num_new_matched_tokens(req, 0) == (8, False)
    connector.request_finished(req, [])  # aborted while waiting for blocks
    with pytest.raises(ChannelError):
        asyncio.run(channel.get(prefix.ref))


def test_tensor_parallel_workers_are_refused():
    with pytest.raises(ValueError, match="one worker"):
        ChannelKVConnector(_config(tensor_parallel=2), KVConnectorRole.SCHEDULER, NS(num_blocks=8))


@pytest.mark.parametrize("shape", [(64, 2, 4, 32), (64, 32, 4, 8), (96, 2, 1, 8), (32, 2, 4)])
def test_a_cache_view_not_of_blocks_or_their_kernel_blocks_is_refused_at_start(shape):
    """Twice the blocks, each a whole block of tokens (and one with a dimension of the block
    count, which a search for the block dim would have taken); three kernel blocks of one
    token, which do not make a 4-token block; not 4-D. Blocks and kernel blocks of 2 tokens
    (64 rows: block b is rows 2b, 2b + 1) are taken."""
    worker = ChannelKVConnector(_config(), KVConnectorRole.WORKER, NS(num_blocks=32))
    worker.register_kv_caches({"layer.0": torch.zeros(32, 2, 4, 8)})
    worker.register_kv_caches({"layer.0": torch.arange(64.0).view(64, 1, 1, 1).expand(64, 2, 2, 8)})
    assert worker._caches["layer.0"][5, :, 0, 0, 0].tolist() == [10.0, 11.0]
    with pytest.raises(ValueError, match="not supported"):
        worker.register_kv_caches({"layer.0": torch.zeros(shape)})


@pytest.mark.parametrize(
    ("named", "backend"),
    [(None, "inline"), ("direct", "direct"), ("shared_memory_direct", "shared_memory_direct")],
)
def test_an_export_goes_on_the_backend_its_request_names(named, backend):
    """The Thinker names "shared_memory_direct" when the cluster spans hosts: this process
    (vLLM's engine) is no Ray worker, and its own auto choice would be shared memory, which a
    replica on another host cannot read."""
    from omni_serve.transport.kv_blocks import CHANNEL_KEY

    params = {"omni_kv_export": True, **({CHANNEL_KEY: named} if named else {})}
    scheduler = ChannelKVConnector(_config(), KVConnectorRole.SCHEDULER, NS(num_blocks=32))
    scheduler.on_new_request(request("a", list(range(8)), params))
    meta = scheduler.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    worker = ChannelKVConnector(_config(), KVConnectorRole.WORKER, NS(num_blocks=32))
    worker.register_kv_caches({"layer.0": torch.arange(32 * 64.0).view(32, 2, 4, 8)})
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()
    prefix = KVPrefix.decode(worker.build_connector_worker_meta().prefixes["a"])
    assert prefix.ref.backend == backend
    blocks = asyncio.run(take(prefix.ref))
    assert torch.equal(blocks["layer.0"], torch.arange(32 * 64.0).view(32, 2, 4, 8)[[1, 2]])


def test_an_export_naming_no_such_backend_is_not_made_and_the_request_goes_on():
    from omni_serve.transport.kv_blocks import CHANNEL_KEY

    scheduler = ChannelKVConnector(_config(), KVConnectorRole.SCHEDULER, NS(num_blocks=32))
    params = {"omni_kv_export": True, CHANNEL_KEY: "carrier_pigeon"}
    scheduler.on_new_request(request("a", list(range(8)), params))
    meta = scheduler.build_connector_meta(step(new=[("a", [1, 2], 0)], scheduled={"a": 8}))
    worker = ChannelKVConnector(_config(), KVConnectorRole.WORKER, NS(num_blocks=32))
    worker.register_kv_caches({"layer.0": torch.zeros(32, 2, 4, 8)})
    worker.bind_connector_metadata(meta)
    worker.wait_for_save()
    assert worker.build_connector_worker_meta().prefixes == {"a": ""}  # "": not exported
