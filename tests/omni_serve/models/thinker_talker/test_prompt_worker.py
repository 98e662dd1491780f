"""Prompts are built off the event loop: media decode in worker threads, several requests at
once; everything that uses the processor on one thread; the prompt is the one
``prepare_prompt`` builds in place."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from PIL import Image

from omni_serve.config import ApiSettings
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.media.decode import MediaError
from omni_serve.models.qwen3_omni.family import FAMILY
from omni_serve.models.thinker_talker import prompt_worker
from omni_serve.models.thinker_talker.prompt_worker import PromptWorker
from omni_serve.models.thinker_talker.request import prepare_prompt
from omni_serve.testing.media import gray_frames, png_data_url, video_data_url, wav_b64


def chat(*parts: dict) -> list[ChatMessage]:
    return [ChatMessage.model_validate({"role": "user", "content": list(parts)})]


TONE = (np.sin(np.arange(8000) / 5) * 0.3).astype(np.float32)
AUDIO = {"type": "input_audio", "input_audio": {"data": wav_b64(TONE, 16000)}}
IMAGE = {
    "type": "image_url",
    "image_url": {"url": png_data_url(Image.fromarray(np.full((56, 84, 3), 90, np.uint8)))},
}
VIDEO = {"type": "video_url", "video_url": {"url": video_data_url(gray_frames(10))}}
TEXT = {"type": "text", "text": "What is in these?"}


async def test_the_prompt_is_the_one_built_in_place(omni_processor):
    api = ApiSettings()
    messages = chat(AUDIO, IMAGE, VIDEO, TEXT)
    worker = PromptWorker(omni_processor, api, FAMILY)
    try:
        got = await worker.chat(messages)
    finally:
        worker.close()
    expected = prepare_prompt(omni_processor, messages, api, family=FAMILY)
    assert got.prompt_ids == expected.prompt_ids
    assert got.counts == expected.counts == {"audio": 1, "image": 1, "video": 1}
    assert got.image_grid_thw.tolist() == expected.image_grid_thw.tolist()
    assert got.video_grid_thw.tolist() == expected.video_grid_thw.tolist()
    assert got.audio_seqlens.tolist() == expected.audio_seqlens.tolist()
    assert np.array_equal(got.multi_modal_data["video"], expected.multi_modal_data["video"])


async def test_processor_work_runs_on_one_thread_and_decoding_side_by_side(monkeypatch):
    """Two requests decode at once (each waits for the other at a barrier: decoding one after
    another would break it); every ``prepare_prompt`` runs on the same thread, not the loop's."""
    both_decoding = threading.Barrier(2, timeout=10)
    decode_threads, prompt_threads = [], []

    def decode(processor, messages, api, *_):
        decode_threads.append(threading.current_thread())
        both_decoding.wait()
        return {"decoded": True}

    def prepare(processor, messages, api, decoded, *_, family):
        prompt_threads.append(threading.current_thread())
        assert family is FAMILY  # the worker's family's rules build the prompt
        assert decoded == ({"decoded": True} if len(messages[0].content) == 2 else {})
        return "prompt"

    monkeypatch.setattr(prompt_worker, "decode_media", decode)
    monkeypatch.setattr(prompt_worker, "prepare_prompt", prepare)
    worker = PromptWorker(object(), ApiSettings(), FAMILY)
    try:
        prompts = await asyncio.gather(*(worker.chat(chat(IMAGE, TEXT)) for _ in range(2)))
        prompts.append(await worker.chat(chat(TEXT)))  # no media: nothing to decode
    finally:
        worker.close()
    assert prompts == ["prompt"] * 3
    loop_thread = threading.current_thread()
    assert len(decode_threads) == 2 and len(set(decode_threads)) == 2
    assert loop_thread not in decode_threads
    assert len(prompt_threads) == 3 and len(set(prompt_threads)) == 1
    assert prompt_threads[0] is not loop_thread


async def test_a_bad_part_raises_naming_it(omni_processor):
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    worker = PromptWorker(omni_processor, ApiSettings(), FAMILY)
    try:
        with pytest.raises(MediaError) as caught:
            await worker.chat(chat(TEXT, bad))
    finally:
        worker.close()
    assert caught.value.param == "messages[0].content[1]"


async def test_speech_replies_with_the_text_then_im_end(omni_processor):
    worker = PromptWorker(omni_processor, ApiSettings(), FAMILY)
    try:
        prompt, reply = await worker.speech("Hello there.")
    finally:
        worker.close()
    tokenizer = omni_processor.tokenizer
    assert reply[:-1] == tokenizer("Hello there.")["input_ids"]
    assert reply[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(prompt.prompt_ids).count("Hello there.") == 1
