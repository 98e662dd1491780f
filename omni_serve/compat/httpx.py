"""An httpx transport whose sockets a network backend of ours opens.

Upstream: httpx 0.28.1 (httpcore 1.0.9). ``httpx.AsyncHTTPTransport`` builds its httpcore
connection pool (or proxy pool) itself and takes no ``network_backend``, though httpcore's
pools do. Symptom: no public way to make an httpx client connect through a backend that checks
addresses, or that tells a proxy that cannot be reached from a target that fails
(``omni_serve.media.addresses``).

Fix: build the transport as httpx does (its TLS context, limits, proxy and proxy credentials),
then set the backend on its pool (the private ``_pool._network_backend``, which httpcore's
pools hand to every connection they open).
"""

from __future__ import annotations

import httpcore
import httpx


def transport_over(
    network_backend: httpcore.AsyncNetworkBackend, proxy: str | None = None
) -> httpx.AsyncHTTPTransport:
    """A client using it must not also mount proxies from the environment
    (``trust_env=False``), or those would open the sockets instead. Through ``proxy``, every
    socket the backend opens is to the proxy."""
    transport = httpx.AsyncHTTPTransport(proxy=proxy)
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError("httpcore's pool changed: see omni_serve/compat/httpx.py")
    pool._network_backend = network_backend
    return transport
