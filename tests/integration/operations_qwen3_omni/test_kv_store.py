"""User story: an operator's app keeps sessions' KV prefixes for every ingress replica, hands
them to the next turn (spoken turns too) and to new sessions that start the same way, and
refuses a damaged page on disk."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from omni_serve.testing.abuse import wait_for
from tests.integration.operations_qwen3_omni.app import SPOKEN, URL, audio_question, chat

pytestmark = pytest.mark.integration


def test_a_sessions_prefix_is_kept_for_the_app_not_per_ingress_replica(served):
    """With two ingress replicas, Serve's proxy sends a session's turns to either: the prefix
    turn one exported is in the app's session store, which /metrics on every ingress replica
    shows (ten asks: each replica answers some), and turn two takes it and leaves its own."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    session = {"session_id": "ops-session-1"}
    turn = [system, {"role": "user", "content": "Name a colour."}]
    first = chat({"messages": turn, "max_tokens": 4, **session})
    assert first.status_code == 200, first.text[:300]
    assert [kept_prefixes() for _ in range(10)] == [1] * 10
    turn += [
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And another?"},
    ]
    second = chat({"messages": turn, "max_tokens": 4, **session})
    assert second.status_code == 200, second.text[:300]
    prompt = first.json()["usage"]["prompt_tokens"]
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt // 128 * 128
    assert [kept_prefixes() for _ in range(4)] == [1] * 4  # turn two's replaced turn one's
    assert kv_store_series("disk", "hits") == 1  # turn one's, from its page (memory keeps none)
    assert kv_store_series("disk", "bytes") > 0


def test_a_voice_chats_next_spoken_turn_is_served_from_the_first_ones_cache(served):
    """User story: a voice chat (audio in, speech out, one session): the second spoken turn
    reuses turn one's KV and the rows turn one kept for the Talker (cached tokens reported),
    and still speaks."""
    system = {"role": "system", "content": "You answer briefly and kindly. " * 40}
    session = {"session_id": "ops-voice-1", **SPOKEN, "max_tokens": 4}
    asked = audio_question()["messages"]  # the audio goes through the encoder stage
    first = chat({"messages": [system, *asked], **session})
    assert first.status_code == 200, first.text[:300]
    reply = first.json()["choices"][0]["message"]
    assert reply["audio"]["data"]
    turn = [system, *asked, {"role": "assistant", "content": reply["content"]}, *asked]
    second = chat({"messages": turn, **session})
    assert second.status_code == 200, second.text[:300]
    assert second.json()["choices"][0]["message"]["audio"]["data"]
    prompt = first.json()["usage"]["prompt_tokens"]
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt // 128 * 128 > 0


def test_a_new_session_that_starts_like_a_kept_one_is_handed_its_prefix(served):
    """User story: two callers of a voice agent send its system prompt and the same greeting
    clip; the second caller's first turn is handed the first caller's kept prefix (found by
    its content, from the disk tier), and answers; a caller with another system prompt is
    not."""
    system = {"role": "system", "content": "You are the front desk of a small hotel. " * 30}
    greeting = audio_question()["messages"]
    hits, misses = kv_store_series("disk", "hits"), kv_store_series("all", "misses")
    first = chat({"messages": [system, *greeting], "max_tokens": 4, "session_id": "ops-caller-a"})
    assert first.status_code == 200, first.text[:300]
    assert kv_store_series("all", "misses") == misses + 1  # nothing kept starts like it
    asked = [system, *greeting, {"role": "user", "content": "Is breakfast included?"}]
    second = chat({"messages": asked, "max_tokens": 4, "session_id": "ops-caller-b"})
    assert second.status_code == 200, second.text[:300]
    assert kv_store_series("disk", "hits") == hits + 1
    other = {"role": "system", "content": "You are a ferry timetable. " * 30}
    third = chat({"messages": [other, *greeting], "max_tokens": 4, "session_id": "ops-caller-c"})
    assert third.status_code == 200, third.text[:300]
    assert kv_store_series("disk", "hits") == hits + 1
    assert kv_store_series("all", "misses") == misses + 2


def test_a_damaged_page_on_disk_is_refused_and_its_turn_answers_as_a_cold_one(served):
    """User story: a conversation's KV page on disk is damaged (a bad sector, a half-copied
    backup); its next turn does not load it, computes its prompt instead, and answers as a
    request that never had a prefix does."""
    system = {"role": "system", "content": "You answer questions about trains. " * 30}
    turn = [system, {"role": "user", "content": "When is the first train?"}]
    greedy = {"max_tokens": 4, "temperature": 0}
    pages = Path(served.kv_pages.name)
    before = set(pages.rglob("*.kvpage"))
    first = chat({"messages": turn, **greedy, "session_id": "ops-damaged"})
    assert first.status_code == 200, first.text[:300]
    wait_for(lambda: set(pages.rglob("*.kvpage")) - before, 30, "the turn's page is written")
    (page,) = set(pages.rglob("*.kvpage")) - before
    data = bytearray(page.read_bytes())
    data[-64:] = bytes(b ^ 0xFF for b in data[-64:])  # the last layer's blocks, not the header
    page.write_bytes(bytes(data))
    refused, hits = kv_store_series("disk", "refused"), kv_store_series("disk", "hits")
    reply = first.json()["choices"][0]["message"]["content"]
    turn = [*turn, {"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    second = chat({"messages": turn, **greedy, "session_id": "ops-damaged"})
    assert second.status_code == 200, second.text[:300]
    assert kv_store_series("disk", "refused") == refused + 1
    assert kv_store_series("disk", "hits") == hits
    cold = chat({"messages": turn, **greedy})  # no session: the store is never asked
    assert cold.status_code == 200, cold.text[:300]
    said = second.json()["choices"][0]["message"]["content"]
    assert said == cold.json()["choices"][0]["message"]["content"]


def kv_store_series(tier: str, what: str) -> float:
    lines = httpx.get(f"{URL}/metrics", timeout=30).text.splitlines()
    series = f'omni_session_kv{{tier="{tier}",what="{what}"}}'
    [line] = [line for line in lines if line.startswith(series)]
    return float(line.split()[-1])


def kept_prefixes() -> float:
    return kv_store_series("all", "prefixes")
