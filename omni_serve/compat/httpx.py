"""An httpx transport whose sockets a network backend of ours opens.

Upstream: httpx 0.28.1 (httpcore 1.0.9). ``httpx.AsyncHTTPTransport`` builds its httpcore
connection pool itself and takes no ``network_backend``, though httpcore's pool does. Symptom:
no public way to make an httpx client connect through a backend that checks addresses
(``omni_serve.api.public_addresses``).

Fix: build the transport, then replace its pool (the private ``_pool``; the transport's
``handle_async_request`` only maps httpx's request and errors onto it) with one that is given
the backend. The replacement keeps httpx's default TLS context and connection limits.
"""

from __future__ import annotations

import httpcore
import httpx


def transport_over(network_backend: httpcore.AsyncNetworkBackend) -> httpx.AsyncHTTPTransport:
    """Direct connections only: a client using it must not also mount proxies from the
    environment (``trust_env=False``), or those would open the sockets instead."""
    transport = httpx.AsyncHTTPTransport()
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=network_backend,
    )
    return transport
