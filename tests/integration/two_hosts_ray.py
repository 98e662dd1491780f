"""The driver connected to a ``TwoHosts`` cluster, for the module fixtures of the tests that
cross hosts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from omni_serve.testing.two_hosts import HostsUnavailable, TwoHosts


def ray_on(hosts: TwoHosts) -> Iterator:
    """Starts ``hosts`` and connects this driver (skips where the namespaces cannot be made:
    not root); yields ``ray``; disconnects and stops them after."""
    import ray

    try:
        hosts.start()
    except HostsUnavailable as exc:  # needs root: ip netns, unshare, mount
        pytest.skip(f"cannot make a second host here: {exc}")
    ray.init(address=hosts.address, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        hosts.stop()
