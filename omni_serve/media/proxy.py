"""Media fetches through an HTTP proxy (``api.media_proxy``), for servers whose egress must.

The proxy opens the sockets and resolves names itself, so the address check cannot run where
a socket opens, as it does for direct fetches (``public_addresses``): it runs before the proxy
is asked. A proxy that cannot be reached is the server's trouble, told apart from a URL that
fails, which is the client's.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpcore
import httpx

from omni_serve.compat.httpx import transport_over
from omni_serve.media.addresses import public_addresses

_PORTS = {"http": 80, "https": 443}


class ProxyUnreachable(Exception):
    """The media proxy could not be connected to: the server's trouble, not the URL's."""


class ThroughProxy(httpx.AsyncBaseTransport):
    """Fetches through an HTTP proxy, which opens the sockets and resolves names itself, so
    the check (``check_targets``) runs before the proxy is asked; the proxy's own address is
    the operator's and not checked. A plain http request names the checked address (the Host
    header keeps the name): a name that resolves elsewhere the second time cannot send the
    proxy inside. An https tunnel names the host, as TLS must verify its certificate, which
    no internal server a rebinding name could point the proxy at can present."""

    def __init__(self, proxy: str, check_targets: bool) -> None:
        self._inner = transport_over(_ToTheProxy(), proxy)
        self._check = check_targets

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if self._check:
            try:
                addresses = await public_addresses(url.host, url.port or _PORTS[url.scheme])
            except httpcore.ConnectError as exc:  # outside httpx's transport: map it here
                raise httpx.ConnectError(str(exc), request=request) from None
            if url.scheme == "http":
                request = httpx.Request(
                    request.method,
                    url.copy_with(host=str(addresses[0])),
                    headers=request.headers,
                    stream=request.stream,
                    extensions=request.extensions,
                )
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ToTheProxy(httpcore.AsyncNetworkBackend):
    """Opens a proxy pool's sockets, all of them to the proxy: a failure to connect is the
    proxy's, not the URL's (a failed TLS handshake with the target comes later)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            return await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
            # Not the proxy's URL in the message: it may hold credentials.
            raise ProxyUnreachable(f"cannot connect to the media proxy: {exc}") from None

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
