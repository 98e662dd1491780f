"""Opening media fetches' connections only to public addresses.

A host-name allowlist cannot keep a fetch off the server's own network: a name the client
controls can resolve to 169.254.169.254 or 10.0.0.5, and can resolve differently between a check
and the connect (DNS rebinding). So the check runs where the socket is opened. The name is
resolved once, every address it resolves to must be public, and the connection goes to one of
those checked addresses. TLS still verifies the certificate against the name, which httpcore
passes to ``start_tls`` apart from the address.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv6Address, ip_address

import httpcore

IPAddress = IPv4Address | IPv6Address


class InternalAddress(Exception):
    """A fetch's host resolved to an address that is not public; nothing was sent to it."""

    def __init__(self, host: str, address: IPAddress) -> None:
        named = host if host == str(address) else f"{host!r} resolves to {address}, which"
        super().__init__(f"{named} is not a public address")
        self.host = host
        self.address = address


def is_public(address: IPAddress) -> bool:
    """Globally routable unicast: not loopback, private, link-local (cloud metadata),
    shared (100.64/10), reserved, unspecified or multicast, IPv4-mapped IPv6 included."""
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


class PublicAddressBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the check in ``connect_tcp``; ``inner`` opens the
    sockets (anyio's by default)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await public_addresses(host, port)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # resolve() returns at least one address
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def public_addresses(host: str, port: int) -> list[IPAddress]:
    """``host``'s addresses (see ``resolve``), each of them public; a name with any internal
    address is refused whole."""
    addresses = await resolve(host, port)
    for address in addresses:
        if not is_public(address):
            raise InternalAddress(host, address)
    return addresses


async def resolve(host: str, port: int) -> list[IPAddress]:
    """``host``'s addresses, in the resolver's order, each once; an IP literal is itself."""
    try:
        return [ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host!r}: {exc.strerror}") from None
    return list(dict.fromkeys(ip_address(info[4][0]) for info in infos))
