"""OpenAI's multi-turn audio through the chat: a spoken reply's transcript is kept under its
audio id (through whichever chat replica), a later turn naming the reply by that id hears
the same prompt as one sending the transcript, and a reply not kept is a 400 naming the id,
a store that does not answer a 503, never a turn that silently drops the reply."""

from __future__ import annotations

import numpy as np
import pytest

from deployments import omni_chat, spoken_reply_store
from deployments.spoken_reply_store import SpokenReplyClient, SpokenReplyStore
from omni_serve.api.errors import ApiError
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.config import ApiSettings
from omni_serve.models.thinker_talker.chat_flow import ChatEvent, ChatOptions, ChatResult, collect
from omni_serve.models.thinker_talker.request import PreparedPrompt
from omni_serve.testing.local_handle import LocalHandle
from tests.deployments.test_omni_chat_prompts import make_chat


def _store():
    return SpokenReplyStore.func_or_class(ttl_s=3600.0, max_bytes=1 << 20)


@pytest.fixture
def chat(omni_processor):
    found = make_chat(
        omni_processor, ApiSettings(), replies=SpokenReplyClient(LocalHandle(_store()))
    )
    yield found
    found.prompts.close()


def _answering(text: str, spoken: bool):
    """A ``stream_chat`` whose reply is ``text``, with audio or without."""

    async def stream_chat(clients, prompt, options, request_id):
        audio = np.zeros(240, dtype=np.float32) if spoken else None
        result = ChatResult(
            text=text, token_ids=[1, 2], finish_reason="stop", prompt_tokens=3, audio=audio
        )
        yield ChatEvent(kind="done", result=result)

    return stream_chat


def _chat(*messages: dict) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "qwen3-omni", "messages": messages})


USER = {"role": "user", "content": "Say hello."}
NEXT = {"role": "user", "content": "Again, slower."}


async def test_a_spoken_reply_is_kept_and_a_later_turn_hears_its_transcript(
    chat, omni_processor, monkeypatch
):
    monkeypatch.setattr(omni_chat, "stream_chat", _answering("Hi!", True))
    prompt = PreparedPrompt(prompt_ids=[1, 2, 3], multi_modal_data={})
    await collect(chat.events(prompt, ChatOptions({}, want_audio=True), "r1", "audio-1"))
    # the next turn reaches another chat replica: the store is the app's
    other = make_chat(omni_processor, ApiSettings(), replies=chat.replies)
    try:
        by_id, _ = await other.prepare(
            _chat(USER, {"role": "assistant", "audio": {"id": "audio-1"}}, NEXT)
        )
        by_text, _ = await other.prepare(_chat(USER, {"role": "assistant", "content": "Hi!"}, NEXT))
    finally:
        other.prompts.close()
    assert by_id.prompt_ids == by_text.prompt_ids
    assert await chat.replies.stats() == {"replies": 1, "bytes": len("Hi!") + 64}


async def test_a_text_reply_keeps_nothing(chat, monkeypatch):
    monkeypatch.setattr(omni_chat, "stream_chat", _answering("Hi!", False))
    prompt = PreparedPrompt(prompt_ids=[1, 2, 3], multi_modal_data={})
    await collect(chat.events(prompt, ChatOptions({}), "r1", "audio-1"))
    assert (await chat.replies.stats())["replies"] == 0


async def test_a_reply_not_kept_is_a_400_naming_its_id(chat):
    named = {"role": "assistant", "audio": {"id": "audio-gone"}}
    with pytest.raises(ApiError) as caught:
        await chat.prepare(_chat(USER, named, NEXT))
    assert caught.value.status == 400 and caught.value.param == "messages[1].audio.id"
    assert "'audio-gone'" in caught.value.message and "expires_at" in caught.value.message


async def test_without_a_store_the_400_says_why(chat):
    chat.replies = None
    named = {"role": "assistant", "audio": {"id": "audio-1"}}
    with pytest.raises(ApiError, match=r"spoken_reply_ttl_s is 0"):
        await chat.prepare(_chat(USER, named, NEXT))
    chat.speaks = False  # a text-only deployment
    with pytest.raises(ApiError, match="makes no spoken replies") as caught:
        await chat.prepare(_chat(USER, named, NEXT))
    assert caught.value.param == "messages[1].audio.id"


class FailingStore:
    async def keep(self, audio_id, transcript):
        raise RuntimeError("store replica died")

    async def transcripts(self, audio_ids):
        raise RuntimeError("store replica died")

    async def stats(self):
        raise RuntimeError("store replica died")


async def test_a_failing_store_fails_no_reply_and_a_lookup_is_a_503(chat, monkeypatch):
    monkeypatch.setattr(omni_chat, "stream_chat", _answering("Hi!", True))
    monkeypatch.setattr(spoken_reply_store, "KEEP_TIMEOUT_S", 0.1)
    chat.replies = SpokenReplyClient(LocalHandle(FailingStore()))
    prompt = PreparedPrompt(prompt_ids=[1, 2, 3], multi_modal_data={})
    result = await collect(chat.events(prompt, ChatOptions({}, want_audio=True), "r1", "a-1"))
    assert result.text == "Hi!"
    with pytest.raises(ApiError) as caught:
        await chat.prepare(_chat(USER, {"role": "assistant", "audio": {"id": "a-1"}}, NEXT))
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "5"}
