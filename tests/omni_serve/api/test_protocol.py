"""Chat messages as OpenAI's clients send them: the roles they use, and an earlier spoken
reply named by its audio id (which the ingress looks up)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_serve.api.protocol import ChatCompletionRequest, stage_seed
from omni_serve.api.speech import SpeechRequest
from omni_serve.media.chat_parts import ChatMessage


def test_an_earlier_spoken_reply_may_be_named_by_its_audio_id_alone():
    named = ChatMessage.model_validate({"role": "assistant", "audio": {"id": "audio-abc"}})
    assert named.content is None and named.reply_by_id == "audio-abc"
    # with its text, the text is what the model hears: nothing to look up
    spoken = ChatMessage.model_validate(
        {"role": "assistant", "content": "Hello.", "audio": {"id": "audio-abc"}}
    )
    assert spoken.content == "Hello." and spoken.reply_by_id is None
    with pytest.raises(ValidationError, match="assistant only") as refused:
        ChatMessage.model_validate({"role": "user", "audio": {"id": "audio-abc"}})
    assert refused.value.errors()[0]["type"] == "audio_not_assistant"


def test_a_message_without_content_is_refused_and_developer_reads_as_system():
    with pytest.raises(ValidationError, match="content is required"):
        ChatMessage.model_validate({"role": "user"})
    assert ChatMessage(role="developer", content="Be brief.").role == "system"


def test_the_request_seed_seeds_the_talker_unless_its_overrides_set_one():
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 7}
    body = ChatCompletionRequest.model_validate(chat)
    derived = body.talker_sampling(body.seed)["seed"]
    assert derived == stage_seed(7, "talker") != stage_seed(8, "talker")
    assert derived != 7  # a stage's own stream, not the Thinker's
    own = ChatCompletionRequest.model_validate(
        {**chat, "stage_overrides": {"talker": {"seed": 3, "temperature": 0.5}}}
    )
    assert own.talker_sampling(own.seed) == {"seed": 3, "temperature": 0.5}
    unseeded = ChatCompletionRequest.model_validate({**chat, "seed": None})
    assert unseeded.talker_sampling(unseeded.seed) == {}
    speech = SpeechRequest.model_validate({"model": "m", "input": "hi", "seed": 7})
    assert speech.talker_sampling(speech.seed) == {"seed": derived}
