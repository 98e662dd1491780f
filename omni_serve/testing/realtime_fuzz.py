"""Fuzzing a served ``/v1/realtime`` session: hundreds of client events, most of them valid
events with a field or three turned into odd types, sizes or removals, some not JSON at all,
then one plain text turn that must still be answered.

A server fault shows as an ``error`` event of type ``server_error``, a ``response.done``
that failed with one, or a socket closed before the last turn's answer; anything a client
sent wrong must be an ``invalid_request_error`` and leave the session usable. The HTTP
routes' counterpart is ``abuse.fuzz_without_server_errors`` (schemathesis over the OpenAPI
spec); the Realtime protocol has no such spec, so its events are mutated from these.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import websockets

_SILENCE_100MS = base64.b64encode(bytes(4_800)).decode()
_TONE_1S = base64.b64encode(b"\x10\x00" * 24_000).decode()
_TEXT_ONLY = {"output_modalities": ["text"], "max_output_tokens": 4}


def _user(part: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [part]}


# One of each client event the server takes, with the settings that changed the most code.
VALID_EVENTS: tuple[dict[str, Any], ...] = (
    {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "instructions": "Answer briefly.",
            "audio": {"input": {"turn_detection": None}},
            **_TEXT_ONLY,
        },
    },
    {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["audio"],
            "max_output_tokens": 6,
            "audio": {
                "input": {
                    "turn_detection": {
                        "type": "server_vad",
                        "silence_duration_ms": 200,
                        "idle_timeout_ms": 5_000,
                    }
                },
                "output": {"voice": "ethan"},
            },
        },
    },
    {
        "type": "session.update",
        "session": {
            "truncation": {
                "type": "retention_ratio",
                "retention_ratio": 0.5,
                "token_limits": {"post_instructions": None},
            }
        },
    },
    {"type": "session.update", "session": {"truncation": "disabled"}},
    {"type": "input_audio_buffer.append", "audio": _SILENCE_100MS},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "item": _user({"type": "input_text", "text": "hello"})},
    {"type": "conversation.item.create", "item": _user({"type": "input_audio", "audio": _TONE_1S})},
    {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi."}],
        },
    },
    {"type": "conversation.item.retrieve", "item_id": "fuzz"},
    {"type": "conversation.item.delete", "item_id": "fuzz"},
    {
        "type": "conversation.item.truncate",
        "item_id": "fuzz",
        "content_index": 0,
        "audio_end_ms": 10,
    },
    {"type": "response.create", "response": _TEXT_ONLY},
    {
        "type": "response.create",
        "response": {
            "conversation": "none",
            "input": [_user({"type": "input_text", "text": "hi"})],
            **_TEXT_ONLY,
        },
    },
    {"type": "response.cancel"},
    {"type": "output_audio_buffer.clear"},
)
ODD_VALUES: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    10**12,
    1.5,
    float("nan"),
    "",
    "x" * 5_000,
    [],
    {},
    [1, 2],
    {"a": 1},
    "\u0000",
    -1e308,
)
NOT_EVENTS: tuple[str | bytes, ...] = ("{", "[]", "null", "1", '"x"', '{"type": 5}', b"\x00\xff")


def fuzzed_events(rng: random.Random, count: int) -> Iterator[str | bytes]:
    """``count`` frames to send: 5% not an event at all, of the rest 80% mutated."""
    for _ in range(count):
        if rng.random() < 0.05:
            yield rng.choice(NOT_EVENTS)
            continue
        event = rng.choice(VALID_EVENTS)
        if rng.random() < 0.8:
            event = mutated(event, rng)
        yield json.dumps(event, allow_nan=True)


def mutated(event: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A copy of ``event`` with one to three of its values (at any depth, ``type`` included)
    replaced by an odd value, removed, or joined by an unknown key."""
    event = copy.deepcopy(event)
    slots: list[tuple[dict | list, Any]] = []

    def walk(node: Any) -> None:
        children = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in children:
            slots.append((node, key))
            if isinstance(value, dict | list):
                walk(value)

    walk(event)
    for _ in range(rng.randint(1, 3)):
        parent, key = rng.choice(slots)
        roll = rng.random()
        if roll < 0.6 or isinstance(parent, list):
            parent[key] = rng.choice(ODD_VALUES)
        elif roll < 0.8:
            parent.pop(key, None)
        else:
            parent[f"extra_{rng.randint(0, 9)}"] = rng.choice(ODD_VALUES)
    return event


@dataclass
class FuzzReport:
    """What a fuzzed session got back."""

    sent: int
    seen: Counter = field(default_factory=Counter)  # server events by type
    faults: list[str] = field(default_factory=list)  # server errors, with what caused them
    last_answer: dict[str, Any] | None = None  # the final text turn's response.done

    def problems(self) -> list[str]:
        """Empty when the session took every frame without a server fault and then answered."""
        problems = list(self.faults)
        if self.last_answer is None:
            problems.append("the final text turn got no response.done")
        elif self.last_answer["status"] not in ("completed", "incomplete"):
            problems.append(f"the final text turn ended {self.last_answer['status']}")
        return problems


async def fuzz_session(url: str, count: int, seed: int, timeout_s: float = 300) -> FuzzReport:
    """Sends ``count`` fuzzed frames to the Realtime socket at ``url`` (ws://.../v1/realtime?
    model=...) while reading everything it answers, then cancels what may still be answering,
    turns the session to text turns and asks one question."""
    report = FuzzReport(sent=count)
    last_sent = ""
    async with websockets.connect(url, max_size=None) as ws:

        async def read() -> None:
            async for raw in ws:
                event = json.loads(raw)
                report.seen[event["type"]] += 1
                fault = server_fault(event)
                if fault is not None:
                    report.faults.append(f"{fault} (last sent: {last_sent[:300]!r})")
                if event["type"] == "response.done" and last_sent == "final":
                    report.last_answer = event["response"]
                    return

        reader = asyncio.create_task(read())
        try:
            for frame in fuzzed_events(random.Random(seed), count):
                last_sent = frame if isinstance(frame, str) else repr(frame)
                await ws.send(frame)
                await asyncio.sleep(0.005)  # a fast client, not a flood: the answers interleave
            for event in (
                {"type": "response.cancel"},
                {"type": "session.update", "session": VALID_EVENTS[0]["session"]},
                {"type": "input_audio_buffer.clear"},
            ):
                await ws.send(json.dumps(event))
            await _quiet(report, 1.0, timeout_s)
            last_sent = "final"
            item = _user({"type": "input_text", "text": "Are you there?"})
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(reader)
        except websockets.ConnectionClosed as closed:
            report.faults.append(f"the socket closed: {closed} (last sent: {last_sent[:300]!r})")
        except TimeoutError:  # the last turn's answer, or the quiet before it, never came
            report.faults.append(
                f"no answer within {timeout_s:g} s (last sent: {last_sent[:300]!r})"
            )
        finally:
            reader.cancel()
    failed = reader.exception() if reader.done() and not reader.cancelled() else None
    if failed is not None and not isinstance(failed, websockets.ConnectionClosed):
        report.faults.append(f"reading the socket failed: {failed!r}")
    return report


async def _quiet(report: FuzzReport, quiet_s: float, timeout_s: float) -> None:
    """Until no event has come for ``quiet_s``: answers begun by the fuzzed events are over."""
    async with asyncio.timeout(timeout_s):
        while True:
            before = report.seen.total()
            await asyncio.sleep(quiet_s)
            if report.seen.total() == before:
                return


def server_fault(event: dict[str, Any]) -> str | None:
    """What was wrong, when ``event`` shows a server fault rather than a refused request."""
    if event["type"] == "error" and event["error"].get("type") != "invalid_request_error":
        return f"error event {json.dumps(event['error'])[:400]}"
    if event["type"] == "response.done" and event["response"]["status"] == "failed":
        error = (event["response"].get("status_details") or {}).get("error") or {}
        if error.get("type") != "invalid_request_error":
            return f"failed response {json.dumps(error)[:400]}"
    return None
