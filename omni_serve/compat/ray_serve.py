"""Ray Serve: what the ingress needs and Serve does not expose publicly.

Ray 2.60: there is no public API for the address Serve's HTTP proxies bind (``http_options``
of the Serve config, ``serve start --http-host``). The controller's ``HTTPOptions`` is the
source of truth; the private Serve client caches it. If that ever breaks, the ingress treats
the address as unknown (loopback, Serve's default) rather than failing to start.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def proxy_host() -> str | None:
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception as exc:  # an upstream change: say so, do not block serving
        log.warning("cannot read Serve's HTTP bind address (%s); assuming loopback", exc)
        return None
