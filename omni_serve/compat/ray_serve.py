"""Ray Serve: what the ingress needs and Serve does not expose publicly.

Ray 2.60: ``ActorDiedError`` carries the dead actor's class name only in its message
(``class_name: ServeReplica:<app>:<deployment>``), also when it arrives wrapped in the
``RayTaskError`` of the replica that was waiting on it. ``dead_deployment`` reads it from there
so a client hears which stage died; if the format changes, errors just do not name the stage.

Ray 2.60: there is no public API for the address Serve's HTTP proxies bind (``http_options``
of the Serve config, ``serve start --http-host``). The controller's ``HTTPOptions`` is the
source of truth; the private Serve client caches it. If that ever breaks, the ingress treats
the address as unknown (loopback, Serve's default) rather than failing to start.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)
_DEAD_REPLICA = re.compile(r"class_name: ServeReplica:[^:\s]+:([^\s]+)")


def proxy_host() -> str | None:
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception as exc:  # an upstream change: say so, do not block serving
        log.warning("cannot read Serve's HTTP bind address (%s); assuming loopback", exc)
        return None


def dead_deployment(exc: BaseException) -> str | None:
    """The deployment whose replica's death ``exc`` (a ``RayActorError``) reports, if named."""
    match = _DEAD_REPLICA.search(str(exc))
    return match.group(1) if match else None
