"""Ray Serve: what the ingress needs and Serve does not expose publicly.

Ray 2.60: ``ActorDiedError`` carries the dead actor's class name only in its message
(``class_name: ServeReplica:<app>:<deployment>``), also when it arrives wrapped in the
``RayTaskError`` of the replica that was waiting on it. ``dead_deployment`` reads it from there
so a client hears which stage died; if the format changes, errors just do not name the stage.

Ray 2.60: there is no public API for the address Serve's HTTP proxies bind (``http_options``
of the Serve config, ``serve start --http-host``). The controller's ``HTTPOptions`` is the
source of truth; the private Serve client caches it. If that ever breaks, the ingress treats
the address as unknown (loopback, Serve's default) rather than failing to start.

Ray 2.60 (core): there is no public key-value store for what a library keeps per node. The
transport records each node's host id (``omni_serve.transport.hosts``) in the internal KV of
the cluster's GCS (``ray.experimental.internal_kv``), as Ray's own libraries do. If that API
goes, each process asks the nodes for their ids itself (a task per node, answers kept in the
process) instead of reading them: said once.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger(__name__)
_DEAD_REPLICA = re.compile(r"class_name: ServeReplica:[^:\s]+:([^\s]+)")
KV_NAMESPACE = "omni_serve"
_kv_failed = False


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


def kv_put(key: str, value: str) -> None:
    """Write ``key`` in the cluster's internal KV (namespace ``omni_serve``)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)
    except Exception as exc:  # an upstream change: degrade, do not fail the caller
        _kv_unavailable(exc)


def kv_get(key: str) -> str | None:
    """``key``'s value in the cluster's internal KV, or None (unset, or the KV is gone)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_get

        value = _internal_kv_get(key, namespace=KV_NAMESPACE)
    except Exception as exc:
        _kv_unavailable(exc)
        return None
    return value.decode() if value is not None else None


def kv_del(key: str) -> None:
    """Delete ``key`` from the cluster's internal KV (no error when it is not there)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_del

        _internal_kv_del(key, namespace=KV_NAMESPACE)
    except Exception as exc:
        _kv_unavailable(exc)


def _kv_unavailable(exc: Exception) -> None:
    global _kv_failed
    if not _kv_failed:
        _kv_failed = True
        log.warning("Ray's internal KV is not usable (%s): processes ask nodes for host ids", exc)


def forget_cluster_address(address: str) -> None:
    """Ray 2.60: ``ray start --head`` writes its address to ``<temp>/ray/ray_current_cluster``
    and only ``ray stop`` removes it, so a head stopped any other way leaves it, and a later
    ``ray.init()`` with no address tries to join that dead cluster ("When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided"). Removes the file when it
    names ``address``."""
    try:
        from ray._common.utils import get_ray_address_file

        path = get_ray_address_file(None)
        with open(path) as f:
            if f.read().strip() == address:
                os.remove(path)
    except FileNotFoundError:
        return
    except Exception as exc:  # an upstream change: say so, do not fail the caller's cleanup
        log.warning("cannot check Ray's current-cluster file (%s)", exc)
