"""Every channel backend passes the same contract."""

from __future__ import annotations

import pickle

import pytest
import torch

from omni_serve.transport import AutoChannel, ChannelError, make_channel
from omni_serve.transport.base import cat_into

BACKENDS = [
    "inline",
    "shared_memory",
    "direct",
    "shared_memory_direct",
    pytest.param("object_store", marks=pytest.mark.integration),
    "auto",
]


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(params=BACKENDS)
def channel(request):
    if request.param == "object_store":
        request.getfixturevalue("ray_local")
    if request.param == "auto":
        return AutoChannel(inline_max_bytes=1 << 30)  # stays inline: no Ray in the unit tier
    return make_channel(request.param)


def payloads():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=gen)
    yield "float32", base
    yield "bfloat16", base.to(torch.bfloat16)
    yield "float16", base.half()
    yield "int64", torch.randint(0, 2048, (16, 5), generator=gen)
    yield "bool", base > 0
    yield "uint8", torch.randint(0, 256, (7,), generator=gen, dtype=torch.uint8)
    yield "complex64", torch.randn(3, 4, generator=gen, dtype=torch.complex64)
    yield "float8_e4m3fn", base.to(torch.float8_e4m3fn)  # no numpy dtype: bytes carry it
    yield "empty", torch.empty(0, 64)
    yield "non_contiguous", base.t()
    yield "scalar", torch.tensor(3.5)
    yield "dict", {0: base, 4: base[:2].to(torch.bfloat16)}


@pytest.mark.parametrize(("name", "payload"), list(payloads()), ids=[n for n, _ in payloads()])
async def test_round_trip(channel, name, payload):
    ref = channel.put(payload)
    wire = pickle.loads(pickle.dumps(ref)) if ref.backend != "object_store" else ref
    got = await channel.get(wire)
    if isinstance(payload, dict):
        assert set(got) == set(payload)
        for k in payload:
            assert same(got[k], payload[k])
    else:
        assert same(got, payload)
    assert ref.nbytes == sum(
        t.numel() * t.element_size()
        for t in (payload.values() if isinstance(payload, dict) else [payload])
    )


def same(got: torch.Tensor, sent: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (fp8 has no ``torch.equal``)."""
    raw = [t.contiguous().reshape(-1).view(torch.uint8) for t in (got, sent)]
    return got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(*raw)


async def test_a_small_slice_of_a_large_tensor_travels_as_its_own_bytes(channel):
    """Pickling a tensor that views a larger one sends all of that one's storage: 8 bytes of
    a 4 MB tensor would make a 4 MB handle argument."""
    big = torch.arange(1_000_000, dtype=torch.float32)
    ref = channel.put(big[10:12])
    assert len(pickle.dumps(ref)) < 4096
    assert torch.equal(await channel.get(ref), big[10:12])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ([torch.ones(2)], "tensor or a dict of tensors, not a list"),
        ({"a": {"b": torch.ones(2)}}, "'a'.*is a dict, not a tensor"),
        ({"a": 1.0}, "is a float, not a tensor"),
        (torch.eye(3).to_sparse(), "sparse_coo tensor"),
        ({1: torch.ones(2), "1": torch.zeros(2)}, "collide as strings"),
    ],
)
def test_what_no_backend_carries_is_refused_at_put_with_the_reason(channel, payload, reason):
    """Not an AttributeError from deep inside a backend, nor a sparse tensor that crosses
    inline and fails past the inline size, nor two keys silently read back as one tensor."""
    with pytest.raises(TypeError, match=reason):
        channel.put(payload)


async def test_get_after_free_fails_and_double_free_is_harmless(channel):
    ref = channel.put(torch.ones(3))
    channel.free(ref)
    channel.free(ref)
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(ref)


async def test_release_frees_refs_a_refused_call_carried_and_skips_none(channel):
    from omni_serve.transport import release

    ref = channel.put(torch.ones(3))
    release(None, ref)
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(ref)


def test_auto_picks_inline_for_small_payloads():
    auto = AutoChannel(inline_max_bytes=1024)
    assert auto.put(torch.zeros(16)).backend == "inline"


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="not available"):
        make_channel("carrier_pigeon")


async def test_take_reads_then_frees(channel):
    from omni_serve.transport import take

    ref = channel.put(torch.arange(4))
    assert torch.equal(await take(ref), torch.arange(4))
    with pytest.raises(ChannelError):
        await take(ref)


def _meta(payload):
    """The payload's shapes and dtypes only, as a producer asks for memory before it has data."""
    if isinstance(payload, dict):
        return {k: torch.empty(t.shape, dtype=t.dtype, device="meta") for k, t in payload.items()}
    return torch.empty(payload.shape, dtype=payload.dtype, device="meta")


@pytest.mark.parametrize(("name", "payload"), list(payloads()), ids=[n for n, _ in payloads()])
async def test_a_payload_written_into_reserved_memory_round_trips(channel, name, payload):
    reservation = channel.reserve(_meta(payload))
    if isinstance(payload, dict):
        assert set(reservation.tensors) == set(payload)
        for k, t in payload.items():
            reservation.tensors[k].copy_(t)
    else:
        reservation.tensors.copy_(payload)
    ref = reservation.commit()
    wire = pickle.loads(pickle.dumps(ref)) if ref.backend != "object_store" else ref
    got = await channel.get(wire)
    for k, t in payload.items() if isinstance(payload, dict) else [("", payload)]:
        out = got[k] if isinstance(payload, dict) else got
        assert out.dtype == t.dtype and out.shape == t.shape and torch.equal(out, t)
    del got, out  # shared memory hands a segment back once this process's views of it die
    channel.free(ref)
    with pytest.raises(ChannelError, match="freed"):
        await channel.get(ref)


def test_cat_into_writes_the_concatenation_cut_at_the_output_size():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(n, 6, generator=gen).to(torch.bfloat16) for n in (3, 1, 4)]
    rows = torch.full((7, 6), float("nan"))  # one row short of all the parts
    cat_into(rows, parts)
    assert torch.equal(rows, torch.cat(parts)[:7].float())
    wide = torch.empty(1, 18)
    cat_into(wide, [p[:1] for p in parts], dim=-1)
    assert torch.equal(wide, torch.cat([p[:1] for p in parts], dim=-1).float())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # deprecated, still made
def test_a_quantized_tensor_is_refused_not_viewed_as_bytes(channel):
    """Viewing a quantized tensor's bytes crashes the process (torch 2.13)."""
    quantized = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    with pytest.raises(TypeError, match="quantized tensor"):
        channel.put(quantized)


@pytest.mark.integration
async def test_auto_sends_what_a_full_shared_memory_cannot_take_through_the_object_store(
    ray_local, monkeypatch, caplog
):
    """A request is answered when /dev/shm is full, and the log (and /metrics, through the
    producer's ``overflowed`` count) says why it got slower."""
    from omni_serve.transport import ChannelFull, channel_stats, shared_memory, shm_pool, take
    from omni_serve.transport import channels as transport

    def full(size, pooled):
        raise ChannelFull("no room for a segment in /dev/shm")

    monkeypatch.setattr(shm_pool, "create_segment", full)
    monkeypatch.setattr(shared_memory, "_pool", shm_pool.SegmentPool())
    monkeypatch.setattr(transport, "_overflowed", False)
    overflowed = channel_stats()["overflowed"]
    auto, payload = AutoChannel(inline_max_bytes=1024), torch.arange(4096.0)
    ref = auto.put(payload)
    reservation = auto.reserve(payload)
    reservation.tensors.copy_(payload)
    reserved = reservation.commit()
    assert (ref.backend, reserved.backend) == ("object_store", "object_store")
    assert channel_stats()["overflowed"] == overflowed + 2
    assert torch.equal(await take(ref), payload) and torch.equal(await take(reserved), payload)
    (warned,) = [r.getMessage() for r in caplog.records if "no room" in r.getMessage()]
    assert "through the object store" in warned  # once, not per payload
