"""How the direct backend tells owners their buffers are free: from an agent of its own, with a
bounded set of owners loaded.

Why a second agent: a notification in flight on the reading agent holds its next transfer
until the owner progresses (see ``compat.nixl.new_notifier``). Why bounded: owners come and go
with replicas (scale-downs, restarts, redeploys), and every owner loaded keeps a connection and
its metadata in the agent for the life of the process. Past ``MAX_OWNERS`` the least recently
notified owner is dropped, once nothing sent to it can still be queued (``QUIET_S``); a later
free to it loads it again.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

MAX_OWNERS = max(1, int(os.environ.get("OMNI_DIRECT_MAX_OWNERS", 64)))  # the one in use stays
# An owner is dropped only this long after the last free sent to it: dropping a connection
# may lose what it has not sent yet (frees go out as the endpoint's loop progresses, every
# 0.1-50 ms), and a lost free holds the owner's buffer until its lease runs out.
QUIET_S = 5.0


class Notifier:
    """Not thread-safe: the endpoint calls it under its lock."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.agent: Any = None  # made at the first free: most processes only ever put
        self.owners: OrderedDict[str, float] = OrderedDict()  # owner -> last sent, oldest first
        self.sent_at = 0.0  # when a free last went out (the endpoint's loop speeds up after)

    def send(self, owner: str, metadata: bytes, message: str) -> bool:
        """Queue ``message`` for ``owner`` (whose NIXL metadata is ``metadata``); it goes out
        as ``progress`` runs. False if the owner cannot be reached (gone: nothing to free)."""
        from omni_serve.compat.nixl import new_notifier

        if self.agent is None:
            self.agent = new_notifier(self.name)
        try:
            if owner not in self.owners:
                self.agent.add_remote_agent(metadata)
            self.agent.send_notif(owner, message)
        except Exception:  # nixl raises its own types (remote disconnected, not found)
            self.forget(owner)
            return False
        self.sent_at = time.monotonic()
        self.owners[owner] = self.sent_at
        self.owners.move_to_end(owner)
        self._trim()
        return True

    def progress(self) -> None:
        """Send what is queued (UCX moves only when its worker is progressed)."""
        if self.agent is not None:
            self.agent.get_new_notifs()

    def forget(self, owner: str) -> None:
        from omni_serve.compat.nixl import drop_remote_agent

        self.owners.pop(owner, None)
        if self.agent is not None:
            drop_remote_agent(self.agent, owner)

    def _trim(self) -> None:
        quiet_since = time.monotonic() - QUIET_S
        while len(self.owners) > MAX_OWNERS:
            oldest, last_sent = next(iter(self.owners.items()))
            if last_sent > quiet_since:
                return  # over the bound until it goes quiet; the next send trims again
            self.forget(oldest)
