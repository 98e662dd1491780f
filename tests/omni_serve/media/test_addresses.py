"""The connect-time address check: which addresses count as public, and a connection opens
only to an address that was checked, never to a name resolved again later."""

from __future__ import annotations

from ipaddress import ip_address

import httpcore
import pytest

from omni_serve.media import addresses as public_addresses
from omni_serve.media.addresses import InternalAddress, PublicAddressBackend, is_public


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.215.14", True),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("10.1.2.3", False),
        ("172.16.0.9", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.251", False),  # multicast
        ("fd00::1", False),
        ("fe80::1", False),
        ("::ffff:10.0.0.1", False),  # IPv4-mapped
        ("::ffff:93.184.215.14", True),
    ],
)
def test_which_addresses_are_public(address, public):
    assert is_public(ip_address(address)) is public


class RecordingBackend(httpcore.AsyncNetworkBackend):
    """Opens nothing: records where it was asked to connect, refusing the addresses in
    ``unreachable``."""

    def __init__(self, unreachable: frozenset[str] = frozenset()) -> None:
        self.unreachable = unreachable
        self.tried: list[tuple[str, int]] = []

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.tried.append((host, port))
        if host in self.unreachable:
            raise httpcore.ConnectError(f"{host} unreachable")
        return httpcore.AsyncMockStream([])


def resolving_to(monkeypatch, *addresses: str) -> None:
    async def resolve(host: str, port: int):
        return [ip_address(a) for a in addresses]

    monkeypatch.setattr(public_addresses, "resolve", resolve)


async def test_a_name_connects_to_its_checked_addresses_in_order(monkeypatch):
    resolving_to(monkeypatch, "93.184.215.14", "93.184.215.15")
    inner = RecordingBackend(unreachable=frozenset({"93.184.215.14"}))
    await PublicAddressBackend(inner).connect_tcp("media.example", 443)
    assert inner.tried == [("93.184.215.14", 443), ("93.184.215.15", 443)]


async def test_a_name_with_any_internal_address_opens_nothing(monkeypatch):
    resolving_to(monkeypatch, "93.184.215.14", "10.0.0.5")
    inner = RecordingBackend()
    with pytest.raises(InternalAddress, match="'media.example' resolves to 10.0.0.5"):
        await PublicAddressBackend(inner).connect_tcp("media.example", 443)
    assert inner.tried == []


async def test_when_every_address_fails_the_last_failure_is_raised(monkeypatch):
    resolving_to(monkeypatch, "93.184.215.14", "93.184.215.15")
    inner = RecordingBackend(unreachable=frozenset({"93.184.215.14", "93.184.215.15"}))
    with pytest.raises(httpcore.ConnectError, match="93.184.215.15 unreachable"):
        await PublicAddressBackend(inner).connect_tcp("media.example", 80)


async def test_resolving_an_ip_literal_and_a_name():
    assert await public_addresses.resolve("::1", 80) == [ip_address("::1")]
    assert ip_address("127.0.0.1") in await public_addresses.resolve("localhost", 80)
    with pytest.raises(httpcore.ConnectError, match="cannot resolve 'no-such-host.invalid'"):
        await public_addresses.resolve("no-such-host.invalid", 80)
