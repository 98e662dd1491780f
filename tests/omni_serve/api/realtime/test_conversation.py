"""A conversation's items as the model hears them, and an answer cut short: only the audio
played and the share of its transcript that time covers are kept."""

from __future__ import annotations

import pytest

from omni_serve.api.errors import ApiError
from omni_serve.api.realtime.conversation import BYTES_PER_MS, Conversation, Item, Part


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
