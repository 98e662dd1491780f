"""The chat path checks a chat's options before building its prompt (off the event loop, in its
``PromptWorker``), and answers bad media or an over-long prompt with a 400 naming why."""

from __future__ import annotations

import base64
import types

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from deployments.omni_chat import OmniChat
from omni_serve.api.errors import ApiError, ContextOverflow
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.config import ApiSettings
from omni_serve.models.qwen3_omni.family import FAMILY
from omni_serve.models.thinker_talker import prompt_worker
from omni_serve.models.thinker_talker.prompt_worker import PromptWorker
from omni_serve.observability.metrics import ApiMetrics
from omni_serve.testing.forward_proxy import forward_proxy
from omni_serve.testing.media import png_data_url, wav_b64
from omni_serve.testing.media_server import Route, media_server


def make_chat(processor, api: ApiSettings, **stores) -> OmniChat:
    """The chat path of a speaking pipeline, with no stages behind it."""
    return OmniChat(
        types.SimpleNamespace(api=api, served_model_name="qwen3-omni"),
        PromptWorker(processor, api, FAMILY),
        clients=None,
        metrics=ApiMetrics(),
        voices={"ethan"},
        speaks=True,
        context_tokens=4096,
        media_limits={"image": 4, "audio": 4, "video": {"count": 2}},
        **stores,
    )


@pytest.fixture
def chat(omni_processor):
    found = make_chat(omni_processor, ApiSettings())
    yield found
    found.prompts.close()


@pytest.fixture
def fetching_chat(omni_processor):
    """An chat that fetches remote media URLs, from this host only."""
    api = ApiSettings(
        allow_remote_urls=True,
        allowed_media_domains=["127.0.0.1"],
        allow_private_media_addresses=True,
    )
    found = make_chat(omni_processor, api)
    yield found
    found.prompts.close()


def request(*parts: dict, **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "qwen3-omni", "messages": [{"role": "user", "content": list(parts)}], **fields}
    )


VIDEO = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
TEXT = {"type": "text", "text": "hi"}


async def test_a_corrupt_video_is_a_400_naming_the_part(chat):
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(TEXT, VIDEO))
    error = caught.value
    assert error.status == 400 and "could not decode video" in error.message
    assert error.body["error"]["param"] == "messages[0].content[1]"


async def test_bad_options_are_refused_before_any_media_decodes(chat, monkeypatch):
    def decode(*_):
        raise AssertionError("decoded a request that was refused")

    monkeypatch.setattr(prompt_worker, "decode_media", decode)
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(VIDEO, modalities=["text", "audio"]))
    assert caught.value.status == 400 and caught.value.body["error"]["param"] == "audio"


async def test_a_prompt_over_the_context_is_a_400(chat):
    chat.context_tokens = 8
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request({"type": "text", "text": "hello " * 20}))
    assert caught.value.status == 400 and "context is 8 tokens" in caught.value.message


async def test_a_prompt_leaves_the_reply_room_asked_for_or_says_by_how_much_it_does_not(chat):
    prompt, _ = await chat.prepare(request(TEXT))
    n = len(prompt.expanded_ids or prompt.prompt_ids)
    chat.context_tokens = n + 4
    await chat.prepare(request(TEXT), reply_room=4)  # exactly fits
    with pytest.raises(ContextOverflow) as caught:
        await chat.prepare(request(TEXT), reply_room=5)
    assert (caught.value.prompt_tokens, caught.value.fits) == (n, n - 1)
    assert caught.value.body["error"]["code"] == "context_length_exceeded"
    assert "the answer may take 5" in caught.value.message


async def test_a_valid_chat_gets_its_prompt_and_options(chat):
    prompt, options = await chat.prepare(request(TEXT, max_tokens=7))
    assert prompt.counts == {"audio": 0, "image": 0, "video": 0}
    assert options.sampling["max_tokens"] == 7 and not options.want_audio


async def test_more_videos_than_the_engine_takes_are_refused_before_any_decodes(chat, monkeypatch):
    def decode(*_):
        raise AssertionError("decoded a request that was refused")

    monkeypatch.setattr(prompt_worker, "decode_media", decode)
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(VIDEO, VIDEO, VIDEO, TEXT))
    assert caught.value.status == 400 and caught.value.body["error"]["param"] == "messages"
    assert "at most 2 video item(s) per request; this one has 3" in caught.value.message


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def png_bytes(image: Image.Image) -> bytes:
    return base64.b64decode(png_data_url(image).partition(",")[2])


async def test_an_image_url_gives_the_prompt_its_data_url_gives(fetching_chat):
    cat = Image.new("RGB", (64, 48), "orange")
    with media_server({"/cat.png": Route(png_bytes(cat))}) as server:
        fetched, _ = await fetching_chat.prepare(request(image_part(server.url("/cat.png"))))
    inline, _ = await fetching_chat.prepare(request(image_part(png_data_url(cat))))
    assert fetched.prompt_ids == inline.prompt_ids and fetched.counts["image"] == 1
    assert torch.equal(fetched.image_grid_thw, inline.image_grid_thw)
    assert fetched.multi_modal_data["image"].tobytes() == cat.tobytes()


async def test_a_url_that_does_not_fetch_is_a_400_naming_the_part(fetching_chat):
    with media_server({}) as server, pytest.raises(ApiError) as caught:
        await fetching_chat.prepare(request(TEXT, image_part(server.url("/gone.png"))))
    assert caught.value.status == 400 and "returned HTTP 404" in caught.value.message
    assert caught.value.body["error"]["param"] == "messages[0].content[1]"


async def test_a_media_proxy_that_cannot_be_reached_is_a_502(omni_processor):
    """The server's trouble, not a 400 about the client's URL."""
    with forward_proxy() as gone:
        proxy = gone.url
    api = ApiSettings(allow_remote_urls=True, media_proxy=proxy)
    chat = make_chat(omni_processor, api)
    try:
        with pytest.raises(ApiError) as caught:
            await chat.prepare(request(TEXT, image_part("http://93.184.216.34/cat.png")))
    finally:
        chat.prompts.close()
    assert caught.value.status == 502 and caught.value.body["error"]["code"] == "media_proxy"
    assert "cannot connect to the media proxy" in caught.value.message


async def test_remote_urls_are_a_400_where_the_server_fetches_none(chat):
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(image_part("https://example.com/cat.png")))
    assert caught.value.status == 400 and "api.allow_remote_urls" in caught.value.message


async def test_an_image_bomb_is_a_400(chat):
    bomb = Image.new("1", (20000, 20000))  # 400 M pixels in ~400 KB of PNG
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(image_part(png_data_url(bomb))))
    assert caught.value.status == 400 and "pixels" in caught.value.message


AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}


@pytest.mark.parametrize(
    "flag", [{"use_audio_in_video": True}, {"mm_processor_kwargs": {"use_audio_in_video": True}}]
)
async def test_hearing_videos_with_an_audio_part_too_is_a_400(chat, monkeypatch, flag):
    """Both forms of the switch: omni-serve's, and vLLM's (for clients written for vLLM)."""

    def decode(*_):
        raise AssertionError("decoded a request that was refused")

    monkeypatch.setattr(prompt_worker, "decode_media", decode)
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(VIDEO, AUDIO, **flag))
    assert caught.value.status == 400 and "send no input_audio parts" in caught.value.message


def test_vllm_processor_settings_this_server_does_not_take_are_refused():
    with pytest.raises(ValidationError, match="mm_processor_kwargs.fps"):
        request(TEXT, mm_processor_kwargs={"fps": 4})


async def test_a_fetched_audio_url_is_the_clip_inline_audio_is(fetching_chat):
    tone = np.sin(np.arange(8000) / 5).astype(np.float32) * 0.3
    data = wav_b64(tone, 16000)
    with media_server({"/hello.wav": Route(base64.b64decode(data))}) as server:
        part = {"type": "audio_url", "audio_url": {"url": server.url("/hello.wav")}}
        fetched, _ = await fetching_chat.prepare(request(part, TEXT))
    inline, _ = await fetching_chat.prepare(
        request({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}, TEXT)
    )
    assert fetched.expanded_ids == inline.expanded_ids and fetched.counts["audio"] == 1
    assert np.array_equal(fetched.audio_clips[0], inline.audio_clips[0])


@pytest.mark.parametrize(
    ("fields", "param", "reason"),
    [
        ({"n": 2}, "n", "1 choice per request"),
        ({"logprobs": True}, "logprobs", "does not return logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "call tools"),
        ({"response_format": {"type": "json_object"}}, "response_format", "structured output"),
        ({"top_logprobs": 2}, "top_logprobs", "does not return logprobs"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions", "call tools"),
        ({"tool_choice": "required"}, "tool_choice", "only 'none' or 'auto'"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            "call tools",
        ),
        ({"function_call": {"name": "f"}}, "function_call", "call tools"),
        ({"web_search_options": {}}, "web_search_options", "search the web"),
    ],
)
async def test_openai_settings_this_server_does_not_honour_are_a_400(chat, fields, param, reason):
    """Not an answer that quietly ignores them."""
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(TEXT, **fields))
    assert caught.value.status == 400 and reason in caught.value.message
    assert caught.value.body["error"]["param"] == param


async def test_stops_and_penalties_reach_the_thinkers_sampling(chat):
    _, options = await chat.prepare(
        request(
            TEXT,
            stop="\n\n",
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            top_k=20,
            repetition_penalty=1.1,
            response_format={"type": "text"},
            n=1,
            tool_choice="none",
            function_call="auto",
            top_logprobs=0,
            user="u1",
            store=False,
            metadata={"a": "b"},
            logit_bias={"151645": -100, "7": 2.5},
            min_p=0.05,
            min_tokens=3,
            ignore_eos=True,
        )
    )
    assert options.sampling == {
        "max_tokens": 256,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 20,
        "seed": None,
        "stop": ["\n\n"],
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "logit_bias": {151645: -100, 7: 2.5},
        "min_p": 0.05,
        "min_tokens": 3,
        "ignore_eos": True,
    }
    assert options.cache_key is None
    _, keyed = await chat.prepare(request(TEXT, prompt_cache_key="tenant-7"))
    assert keyed.cache_key == "tenant-7" and keyed.session_id is None
    _, default = await chat.prepare(request(TEXT))
    assert default.sampling["stop"] == [] and default.sampling["top_k"] == -1
    assert default.sampling["logit_bias"] is None and not default.sampling["ignore_eos"]


@pytest.mark.parametrize(
    ("logit_bias", "reason"),
    [
        ({"x": 1}, "keys are token ids, not 'x'"),
        ({"-3": 1}, "keys are token ids, not '-3'"),
        ({"5": 101}, "biases are -100..100, not 101"),
        ({str(i): 1 for i in range(301)}, "at most 300 tokens, not 301"),
    ],
)
def test_a_logit_bias_openai_would_refuse_is_refused(logit_bias, reason):
    with pytest.raises(ValidationError, match=reason):
        request(TEXT, logit_bias=logit_bias)


async def test_min_tokens_over_max_tokens_is_a_400_before_any_media(chat):
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(TEXT, max_tokens=4, min_tokens=5))
    assert caught.value.status == 400 and caught.value.body["error"]["param"] == "min_tokens"
    assert caught.value.message == "min_tokens (5) is over max_tokens (4)"


@pytest.mark.parametrize("stop", [["a", "b", "c", "d", "e"], [""]])
def test_more_than_four_or_empty_stop_sequences_are_refused(stop):
    with pytest.raises(ValidationError, match="at most 4 stop sequences"):
        request(TEXT, stop=stop)


async def test_a_pipeline_without_a_talker_refuses_audio_output(chat):
    chat.speaks = False
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(TEXT, modalities=["text", "audio"], audio={"voice": "ethan"}))
    assert caught.value.status == 400 and "answers in text only" in caught.value.message
    assert caught.value.body["error"]["param"] == "modalities"
    prompt, options = await chat.prepare(request(TEXT))  # text is answered
    assert not options.want_audio


def test_an_audio_format_this_server_does_not_take_is_refused_even_when_the_bytes_decode():
    data = wav_b64(np.zeros(1600, np.float32), 16000)
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "aiff"}}
    with pytest.raises(ValidationError, match="input_audio.format"):
        request(part, TEXT)


async def test_audio_declared_as_one_format_and_sent_as_another_is_a_400(chat):
    data = wav_b64(np.zeros(1600, np.float32), 16000)
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "mp3"}}
    with pytest.raises(ApiError) as caught:
        await chat.prepare(request(part, TEXT))
    assert caught.value.status == 400 and caught.value.param.endswith("input_audio.format")
    assert "'mp3' but the data is a wav file" in caught.value.message
