"""Chat messages as OpenAI's clients send them: the roles they use, and a clear 400 for an
earlier spoken reply named by id, which this server cannot look up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_serve.api.protocol import ChatMessage, SpeechRequest


def test_an_earlier_spoken_reply_named_by_its_audio_id_asks_for_its_transcript():
    with pytest.raises(ValidationError) as refused:
        ChatMessage.model_validate({"role": "assistant", "content": None,
                                    "audio": {"id": "audio-abc"}})  # fmt: skip
    error = refused.value.errors()[0]
    assert error["type"] == "audio_by_id"
    assert "'audio-abc'" in error["msg"] and "send the reply's transcript" in error["msg"]
    # with its text, the id is not needed
    spoken = ChatMessage.model_validate(
        {"role": "assistant", "content": "Hello.", "audio": {"id": "audio-abc"}}
    )
    assert spoken.content == "Hello."


def test_a_message_without_content_is_refused_and_developer_reads_as_system():
    with pytest.raises(ValidationError, match="content is required"):
        ChatMessage.model_validate({"role": "user"})
    assert ChatMessage(role="developer", content="Be brief.").role == "system"


def test_speech_instructions_are_refused_not_ignored():
    steered = SpeechRequest(model="m", input="Hi", instructions="Whisper.")
    assert steered.unsupported() == (
        "instructions",
        "this model's voice cannot be steered by instructions",
    )
    assert SpeechRequest(model="m", input="Hi", instructions="").unsupported() is None
