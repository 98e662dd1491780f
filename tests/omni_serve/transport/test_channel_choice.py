"""Where a payload goes: the auto channel's pick for host and GPU payloads, on one host or
across hosts, with or without NIXL; and the direct backend's care with GPU refs (a producer
waits for its device before a ref leaves, a process without a GPU refuses one with a reason)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omni_serve.transport import (
    AutoChannel,
    ChannelError,
    DirectChannel,
    direct_endpoint,
    make_channel,
)

pytest.importorskip("omni_serve.compat.nixl").load_nixl()


def test_auto_picks_shared_memory_lent_to_nixl_across_hosts_and_plain_on_one(monkeypatch):
    """Across hosts the consumer may be on either: one put serves both (a reader here maps
    the segment, one elsewhere reads it over NIXL: test_shared_memory_direct.py)."""
    from omni_serve.transport import channels as transport

    monkeypatch.setattr(transport, "cluster_is_one_host", lambda: False)
    ref = AutoChannel(inline_max_bytes=16).put(torch.zeros(64))
    assert ref.backend == "shared_memory_direct"
    transport.backend_for(ref).free(ref)
    monkeypatch.setattr(transport, "cluster_is_one_host", lambda: True)
    assert AutoChannel(inline_max_bytes=16)._large().name == "shared_memory"
    monkeypatch.setattr(transport, "nixl_available", lambda: False)
    for backend in ("direct", "shared_memory_direct"):
        with pytest.raises(ValueError, match="nixl-cu12"):
            make_channel(backend)


def test_auto_sends_gpu_payloads_direct_even_on_one_host(monkeypatch):
    """Shared memory would take a GPU payload through host memory twice (device to host, then
    host to device in the consumer); direct reads it GPU to GPU. The GPU round trip itself is
    in test_direct_gpu.py."""
    from omni_serve.transport import channels as transport

    monkeypatch.setattr(transport, "cluster_is_one_host", lambda: True)
    auto, gpu, big = AutoChannel(inline_max_bytes=16), torch.device("cuda", 0), 64 << 20
    assert auto._large(gpu, big).name == "direct"
    assert auto._large(gpu, 1 << 20).name == "shared_memory"  # under the direct read's floor
    assert auto._large(torch.device("cpu"), big).name == auto._large().name == "shared_memory"
    monkeypatch.setattr(transport, "nixl_available", lambda: False)
    assert auto._large(gpu, big).name == "shared_memory"
    pinned = AutoChannel(large=transport.ObjectStoreChannel())
    assert pinned._large(gpu, big).name == "object_store"  # the edge's pin wins


def test_for_a_consumer_without_a_gpu_gpu_payloads_go_through_host_memory(monkeypatch):
    from omni_serve.transport import channels as transport

    monkeypatch.setattr(transport, "cluster_is_one_host", lambda: True)
    auto = AutoChannel(inline_max_bytes=16, gpu_consumer=False)
    assert auto._large(torch.device("cuda", 0), 64 << 20).name == "shared_memory"
    monkeypatch.setattr(transport, "cluster_is_one_host", lambda: False)
    auto = AutoChannel(inline_max_bytes=16, gpu_consumer=False)
    assert auto._large(torch.device("cuda", 0), 64 << 20).name == "shared_memory_direct"
    assert make_channel("direct", gpu_consumer=False).gpu_consumer is False
    assert make_channel("auto", gpu_consumer=False).gpu_consumer is False


async def test_a_gpu_ref_in_a_process_without_a_gpu_fails_with_a_reason(monkeypatch):
    ref = DirectChannel().put(torch.ones(1 << 16))
    gpu_ref = dataclasses.replace(ref, handle=dataclasses.replace(ref.handle, mem_type="VRAM"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ChannelError, match="no GPU"):
        await DirectChannel().get(gpu_ref)
    DirectChannel().free(ref)


def test_a_gpu_ref_leaves_put_and_commit_only_once_the_device_is_done(monkeypatch):
    """GPU copies and kernels are queued, not done, when ``put`` or ``commit`` returns; a
    reader in another process reads the memory regardless of this process's streams, so the
    producer waits for its device first (the GPU run of this is in test_direct_gpu.py)."""
    waited = []
    monkeypatch.setattr(direct_endpoint, "nixl_mem_type", lambda device: ("VRAM", 3))  # host memory
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)  # as if it were on GPU 3
    channel = DirectChannel()
    ref = channel.put(torch.ones(1 << 10))
    assert waited == [3]
    reservation = channel.reserve(torch.empty(1 << 10, device="meta"))
    assert waited == [3]  # nothing written yet
    second = reservation.commit()
    assert waited == [3, 3]
    channel.free(ref)
    channel.free(second)
