"""A conversation's items as the model hears them, and an answer cut short: only the audio
played and the share of its transcript that time covers are kept."""

from __future__ import annotations

import pytest

from omni_serve.api.errors import ApiError
from omni_serve.api.realtime.conversation import (
    BYTES_PER_MS,
    ITEM_BYTES,
    Conversation,
    Item,
    Part,
)


def test_items_become_the_chat_the_model_answers_in_order():
    talk = Conversation()
    user = Item("user", [Part("input_text", text="Hi"), Part("input_audio", pcm=b"\0\0" * 480)])
    reply = Item("assistant", [Part("output_audio", pcm=b"\0\0" * 2400, transcript="Hello.")])
    assert talk.add(user) is None and talk.add(reply) == user.id
    first = Item("system", [Part("input_text", text="Be brief.")])
    talk.add(first, previous_item_id=None)  # last
    messages = talk.messages("You are kind.")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "system"]
    assert messages[1]["content"][1]["input_audio"]["format"] == "wav"
    assert messages[2] == {"role": "assistant", "content": "Hello."}
    opening = Item("user", [Part("input_text", text="First.")])
    assert talk.add(opening, previous_item_id="root") is None
    assert talk.items[0] is opening
    with pytest.raises(ApiError, match="in the conversation already"):
        talk.add(Item("user", [], id=user.id))


def test_a_truncated_answer_keeps_what_was_played():
    words = "one two three four five six seven eight nine ten"
    reply = Item(
        "assistant", [Part("output_audio", pcm=bytes(1000 * BYTES_PER_MS), transcript=words)]
    )
    assert reply.truncate(400)
    part = reply.parts[0]
    assert len(part.pcm) == 400 * BYTES_PER_MS and part.transcript == "one two three four"
    assert reply.status == "incomplete"
    assert not reply.truncate(5000)  # past its end: nothing to cut
    with pytest.raises(ApiError):
        Item("user", [Part("input_text", text="x")]).truncate(10)


def _spoken(n: int, transcript: str | None = None) -> Item:
    pcm = bytes([n]) * 4800
    return Item("user", [Part("input_audio", pcm=pcm, transcript=transcript)], id=f"u{n}")


def _heard_audio(messages: list[dict]) -> list[str]:
    return [part["type"] for m in messages if m["role"] == "user" for part in m["content"]]


def test_past_the_models_audio_items_earlier_turns_are_heard_as_their_transcripts():
    """Qwen3-Omni takes 4 audio items a prompt: a fifth spoken turn moves the window to the
    last two at once, and it stays put for the turns after (the prompt's start, and so the
    KV a turn resumes from, changes once every few turns, not every turn)."""
    talk = Conversation()
    for n in range(1, 5):
        talk.add(_spoken(n, transcript=f"turn {n}" if n % 2 else None))
        talk.add(Item("assistant", [Part("output_text", text=f"reply {n}")]))
        assert _heard_audio(talk.messages(None, 4)) == ["input_audio"] * n
    talk.add(_spoken(5))
    fifth = talk.messages(None, 4)
    assert _heard_audio(fifth) == ["text", "text", "input_audio", "input_audio"]
    assert fifth[0] == {"role": "user", "content": [{"type": "text", "text": "turn 1"}]}
    assert fifth[1] == {"role": "assistant", "content": "reply 1"}
    assert fifth[2] == {"role": "assistant", "content": "reply 2"}  # turn 2 had no transcript
    assert talk.heard_from == "u4"
    talk.add(_spoken(6))
    sixth = talk.messages(None, 4)
    assert sixth[: len(fifth)] == fifth  # the same start: the last turn's KV still applies
    assert _heard_audio(sixth).count("input_audio") == 3
    talk.add(_spoken(7))
    talk.add(_spoken(8))
    assert _heard_audio(talk.messages(None, 4)).count("input_audio") == 2
    assert talk.heard_from == "u7"
    assert _heard_audio(talk.messages(None)).count("input_audio") == 8  # no limit


def _spoken_answer(n: int) -> Item:
    return Item("assistant", [Part("output_audio", pcm=bytes(4800), transcript=f"reply {n}")])


def test_past_its_bytes_a_conversation_lets_go_of_audio_the_model_no_longer_hears():
    """A long voice conversation keeps its memory bounded: past ``max_bytes`` the earlier
    answers' audio goes (the model hears answers as text) and the user's turns before the
    window heard as audio, oldest first; what the model hears does not change, and a
    retrieved item shows its transcript without audio."""
    talk = Conversation(max_bytes=12 * ITEM_BYTES + 6 * 4800)  # 6 clips of 4800 bytes
    heard = []
    for n in range(1, 6):
        talk.add(_spoken(n, transcript=f"turn {n}"))
        heard.append(talk.messages(None, 4))  # each turn's answer hears it
        talk.add(_spoken_answer(n))
    assert talk.heard_from == "u4"  # turn 5 moved the window
    audio_held = [bool(p.pcm) for item in talk.items for p in item.parts]
    # items: turn 1, answer 1, ..., turn 5, answer 5. Turn 5 needed room while turns 1-4 were
    # all heard as audio: answers 1-3 went (answer 4, the newest, kept). Answer 5 then needed
    # one clip's room, with turns 1-3 now before the window: turn 1, the oldest, went.
    assert audio_held == [False, False, True, False, True, False, True, True, True, True]
    now = talk.messages(None, 4)
    assert now[:-1] == heard[-1] and now[-1]["content"] == "reply 5"  # heard as before
    assert sum(i.held_bytes() for i in talk.items) <= talk.max_bytes
    shown = talk.items[0].as_json(audio=True)["content"][0]
    assert shown == {"type": "input_audio", "transcript": "turn 1"}  # no audio key
    assert "audio" in talk.items[-1].as_json(audio=True)["content"][0]
    assert talk.items[0].spoken  # still counts as a spoken turn for the window


def test_an_item_the_model_would_still_hear_past_the_bytes_is_refused_and_nothing_changes():
    talk = Conversation(max_bytes=5 * ITEM_BYTES + 4 * 4800 + 100)
    for n in (1, 2):  # both turns heard as audio; only answer 1's audio may go
        talk.add(_spoken(n))
        talk.add(_spoken_answer(n))
    long_turn = Item("user", [Part("input_audio", pcm=bytes(2 * 4800))], id="long")
    with pytest.raises(ApiError, match="delete items") as refused:
        talk.add(long_turn)  # answer 1's audio would not make room enough
    assert refused.value.body["error"]["code"] == "conversation_full"
    with pytest.raises(ApiError, match="no item"):
        talk.add(_spoken(3), previous_item_id="nope")  # answer 1's audio would do, but no
    assert len(talk.items) == 4 and all(p.pcm for item in talk.items for p in item.parts)
    talk.add(_spoken(3))  # answer 1's audio makes room
    assert [bool(p.pcm) for item in talk.items for p in item.parts] == [1, 0, 1, 1, 1]
    talk.delete("u1")
    talk.delete("u2")
    talk.add(long_turn)  # room again


def test_a_flood_of_tiny_items_counts_against_the_bytes():
    talk = Conversation(max_bytes=100 * ITEM_BYTES)
    with pytest.raises(ApiError, match="conversation_bytes"):
        for _ in range(1000):
            talk.add(Item("user", [Part("input_text", text="hi")]))
    assert 90 <= len(talk.items) < 100
