"""The direct backend's notifier against a recording agent (no NIXL): which owners it keeps."""

from __future__ import annotations

import pytest

from omni_serve.transport import direct_notes
from omni_serve.transport.direct_notes import Notifier


class RecordingAgent:
    def __init__(self, unreachable: frozenset[str] = frozenset()) -> None:
        self.loaded: list[str] = []
        self.sent: list[tuple[str, str]] = []
        self.unreachable = unreachable

    def add_remote_agent(self, metadata: bytes) -> None:
        if metadata.decode() in self.unreachable:
            raise RuntimeError("NIXL_ERR_REMOTE_DISCONNECT")
        self.loaded.append(metadata.decode())

    def send_notif(self, owner: str, message: str) -> None:
        self.sent.append((owner, message))

    def remove_remote_agent(self, owner: str) -> None:
        self.loaded.remove(owner)


@pytest.fixture
def notifier(monkeypatch) -> Notifier:
    monkeypatch.setattr(direct_notes, "MAX_OWNERS", 2)
    notifier = Notifier("test-notes")
    notifier.agent = RecordingAgent(unreachable=frozenset({"gone"}))
    return notifier


def test_an_owner_is_loaded_once_and_past_the_bound_the_least_recent_quiet_one_goes(
    notifier, monkeypatch
):
    monkeypatch.setattr(direct_notes, "QUIET_S", 0.0)
    for owner in ["a", "b", "a", "c"]:
        assert notifier.send(owner, owner.encode(), f"free:{owner}")
    assert notifier.agent.sent == [
        ("a", "free:a"),
        ("b", "free:b"),
        ("a", "free:a"),
        ("c", "free:c"),
    ]
    assert notifier.agent.loaded == ["a", "c"]  # b: least recently notified
    assert list(notifier.owners) == ["a", "c"]
    assert notifier.send("b", b"b", "free:b")  # loaded again when needed
    assert notifier.agent.loaded == ["c", "b"]


def test_an_owner_a_free_may_still_be_queued_for_is_not_dropped(notifier, monkeypatch):
    monkeypatch.setattr(direct_notes, "QUIET_S", 60.0)
    for owner in ["a", "b", "c"]:
        assert notifier.send(owner, owner.encode(), "free:0:1")
    assert notifier.agent.loaded == ["a", "b", "c"]  # over the bound, none quiet yet
    monkeypatch.setattr(direct_notes, "QUIET_S", 0.0)
    notifier.send("c", b"c", "free:0:2")
    assert notifier.agent.loaded == ["b", "c"]


def test_an_unreachable_owner_is_not_kept(notifier):
    assert not notifier.send("gone", b"gone", "free:0:1")
    assert "gone" not in notifier.owners and notifier.agent.loaded == []
