"""The Realtime fuzzer: the same seed sends the same frames, they reach every client event
and some are not events at all, and a server fault or a lost last turn is a problem."""

from __future__ import annotations

import json
import random

from omni_serve.testing.realtime_fuzz import (
    NOT_EVENTS,
    VALID_EVENTS,
    FuzzReport,
    fuzzed_events,
    server_fault,
)


def test_a_seed_sends_the_same_frames_and_they_cover_every_event():
    frames = list(fuzzed_events(random.Random(5), 500))
    assert frames == list(fuzzed_events(random.Random(5), 500))
    assert frames != list(fuzzed_events(random.Random(6), 500))
    assert 5 <= sum(frame in NOT_EVENTS for frame in frames) <= 50
    events = [json.loads(f) for f in frames if f not in NOT_EVENTS]
    valid = [json.dumps(e) for e in VALID_EVENTS]
    mutated = [e for e in events if json.dumps(e) not in valid]
    assert 0.7 < len(mutated) / len(events) < 0.9
    kinds = {e.get("type") for e in events if isinstance(e.get("type"), str)}
    assert {e["type"] for e in VALID_EVENTS} <= kinds


def test_only_server_faults_and_an_unanswered_last_turn_are_problems():
    refused = {"type": "invalid_request_error", "message": "no"}
    fault = {"type": "server_error", "message": "boom"}
    assert server_fault({"type": "error", "error": refused}) is None
    assert "boom" in server_fault({"type": "error", "error": fault})
    failed = {"status": "failed", "status_details": {"error": fault}}
    assert "boom" in server_fault({"type": "response.done", "response": failed})
    refused_answer = {"status": "failed", "status_details": {"error": refused}}
    assert server_fault({"type": "response.done", "response": refused_answer}) is None
    assert FuzzReport(1, last_answer={"status": "completed"}).problems() == []
    assert FuzzReport(1).problems() == ["the final text turn got no response.done"]
    assert FuzzReport(1, last_answer={"status": "cancelled"}).problems() != []
