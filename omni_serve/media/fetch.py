"""Fetching the http(s) media URLs of a chat request (audio, images, videos).

Off unless ``api.allow_remote_urls``: a server that fetches any URL a client names can be made
to read its own network (cloud metadata endpoints, internal services), so an operator turns it
on knowingly and can name the only hosts allowed (``api.allowed_media_domains``), every
redirect hop checked. Whatever the names, connections open only to public addresses unless
``api.allow_private_media_addresses`` (``omni_serve.media.addresses``), also through the
proxy ``api.media_proxy`` names. Each file is
capped while it arrives (a ``Content-Length`` over the cap is refused before the body) and a
request's fetches share one deadline. Every failure is a ``MediaError`` naming the part (a
400), never a 500 or a hang, but for a media proxy that cannot be reached
(``ProxyUnreachable``: the server's trouble, a 502).

Fetching waits on the network, not the CPU, so it runs on the ingress's event loop, all of a
request's URLs at once; the bytes are decoded afterwards, off the loop, as data URLs are.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from omni_serve.compat.httpx import transport_over
from omni_serve.media.addresses import InternalAddress, PublicAddressBackend
from omni_serve.media.decode import MediaError
from omni_serve.media.proxy import ThroughProxy

MAX_REDIRECTS = 3
USER_AGENT = "omni-serve"


@dataclass(frozen=True)
class RemoteMedia:
    """One media part's URL to fetch; ``param`` names the part in a 400."""

    url: str
    kind: str  # "audio" | "image" | "video": in messages
    max_bytes: int
    param: str


@dataclass(frozen=True)
class FetchPolicy:
    allowed_domains: frozenset[str] | None  # exact host names, lower case; None: any host
    timeout_s: float
    private_addresses: bool = False  # whether hosts may resolve to non-public addresses
    proxy: str | None = None  # the HTTP proxy all fetches go through

    def client(self) -> httpx.AsyncClient:
        """Environment proxies are not used when addresses are checked: the check must see
        the address the socket is opened to, or run before a proxy it knows of is asked."""
        common = {"timeout": self.timeout_s, "headers": {"User-Agent": USER_AGENT}}
        if self.proxy is not None:
            transport = ThroughProxy(self.proxy, check_targets=not self.private_addresses)
        elif self.private_addresses:
            return httpx.AsyncClient(**common)
        else:
            transport = transport_over(PublicAddressBackend())
        return httpx.AsyncClient(transport=transport, trust_env=False, **common)

    def check(self, url: httpx.URL, kind: str, param: str) -> None:
        if url.scheme not in ("http", "https"):
            raise MediaError(f"{kind} URLs must be data:, http: or https: URLs", param)
        host = (url.host or "").lower()
        if self.allowed_domains is not None and host not in self.allowed_domains:
            raise MediaError(
                f"{kind} URL host {host!r} is not in this server's allowed_media_domains", param
            )


async def fetch_media(items: list[RemoteMedia], policy: FetchPolicy) -> dict[str, bytes]:
    """The bytes of each item, by URL (a URL given twice is fetched once). The first failure
    cancels the other fetches and is raised."""
    unique = list({item.url: item for item in items}.values())
    if not unique:
        return {}
    async with policy.client() as client:
        try:
            async with asyncio.timeout(policy.timeout_s):
                async with asyncio.TaskGroup() as group:
                    tasks = {
                        item.url: group.create_task(_fetch(client, item, policy)) for item in unique
                    }
        except TimeoutError:
            kinds = sorted({item.kind for item in unique})
            raise MediaError(
                f"fetching the {' and '.join(kinds)} URLs took longer than {policy.timeout_s} s",
                unique[0].param,
            ) from None
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
    return {url: task.result() for url, task in tasks.items()}


async def _fetch(client: httpx.AsyncClient, item: RemoteMedia, policy: FetchPolicy) -> bytes:
    """Redirects are followed here, not by httpx, so that each hop's host is checked."""
    try:
        request = client.build_request("GET", item.url)
    except httpx.InvalidURL as exc:
        raise MediaError(f"not a valid {item.kind} URL: {exc}", item.param) from None
    try:
        for _ in range(MAX_REDIRECTS + 1):
            policy.check(request.url, item.kind, item.param)
            response = await client.send(request, stream=True)
            try:
                if response.next_request is None:
                    return await _read_capped(response, item)
                request = response.next_request
            finally:
                await response.aclose()
    except InternalAddress as exc:
        reason = f"{item.kind} URL host {exc}; this server fetches only from public addresses"
        raise MediaError(f"{reason} (api.allow_private_media_addresses)", item.param) from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise MediaError(f"could not fetch the {item.kind} URL: {reason}", item.param) from None
    raise MediaError(f"{item.kind} URL redirects more than {MAX_REDIRECTS} times", item.param)


async def _read_capped(response: httpx.Response, item: RemoteMedia) -> bytes:
    if response.status_code != 200:
        raise MediaError(
            f"fetching the {item.kind} URL returned HTTP {response.status_code}", item.param
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > item.max_bytes:
        raise MediaError(
            f"{item.kind} is {declared} bytes; the limit is {item.max_bytes}", item.param
        )
    body = bytearray()
    async for chunk in response.aiter_bytes():  # decompressed: the cap is on what is decoded
        body += chunk
        if len(body) > item.max_bytes:
            raise MediaError(f"{item.kind} is over the limit of {item.max_bytes} bytes", item.param)
    return bytes(body)
