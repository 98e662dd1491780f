"""A DeploymentHandle over a local object, for tests of code that calls small deployments
(the app's stores) without starting Serve."""

from __future__ import annotations

import types
from typing import Any


class LocalHandle:
    """``handle.method.remote(*args)`` runs ``replica.method(*args)`` (a coroutine to await)."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica

    def __getattr__(self, method: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(remote=lambda *args: getattr(self.replica, method)(*args))
