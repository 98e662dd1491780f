"""A Realtime session takes hundreds of fuzzed client events (odd types and sizes, missing and
unknown fields, frames that are not events) without a server fault, and answers the plain
text turn after them. The served counterpart runs the real stages
(tests/integration/served_qwen3_omni/test_realtime.py)."""

from __future__ import annotations

import pytest

from omni_serve.testing.realtime_fuzz import fuzz_session


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_fuzzed_events_get_no_server_fault_and_the_session_answers_after(
    realtime_server, seed
):
    url, chat = realtime_server
    report = await fuzz_session(url.replace("http", "ws") + "/realtime", 400, seed, 60)
    assert report.problems() == []
    assert report.seen["error"] > 100  # the mutations were refused, one error event each
    assert report.seen["response.done"] > 1  # and the valid ones answered
    assert chat.asks[-1].messages[-1]["content"][0]["text"] == "Are you there?"


async def test_a_last_turn_that_never_ends_is_a_problem(realtime_server):
    """The fuzzer fails a session whose answer never comes, rather than waiting on it."""
    url, chat = realtime_server
    chat.endless, chat.gap_s = True, 0.01
    report = await fuzz_session(url.replace("http", "ws") + "/realtime", 20, 1, timeout_s=3)
    assert report.last_answer is None
    assert [p.split(" (")[0] for p in report.problems()] == [
        "no answer within 3 s",
        "the final text turn got no response.done",
    ]
