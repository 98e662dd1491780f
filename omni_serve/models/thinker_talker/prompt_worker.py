"""Prompts built off the serving event loop.

An ingress streams every request's tokens and audio from one asyncio loop, so anything slow it
runs inline stalls them all: decoding a 1080p PNG takes ~50 ms of CPU here, a video seconds.
Remote media URLs are fetched on the loop first (they wait on the network:
``omni_serve.media.fetch``). Decoding touches nothing shared, so requests decode in the
default thread pool side by side. Everything that uses the processor runs on ONE thread:
its calls set the fast tokenizer's padding and truncation state before encoding
(``set_truncation_and_padding`` in transformers 5), state two threads would share.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from omni_serve.config import ApiSettings
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.media.fetch import FetchPolicy, fetch_media
from omni_serve.models.thinker_talker.family import ThinkerTalkerFamily
from omni_serve.models.thinker_talker.request import (
    PreparedPrompt,
    decode_media,
    has_media_parts,
    prepare_prompt,
    remote_media,
)

T = TypeVar("T")


class PromptWorker:
    def __init__(self, processor: Any, api: ApiSettings, family: ThinkerTalkerFamily) -> None:
        self.processor = processor
        self.api = api
        self.family = family
        self._processor_thread = ThreadPoolExecutor(1, thread_name_prefix="omni-prompt")
        domains = api.allowed_media_domains
        self._fetch_policy = FetchPolicy(
            None if domains is None else frozenset(d.lower() for d in domains),
            api.media_fetch_timeout_s,
            api.allow_private_media_addresses,
            api.media_proxy,
        )

    async def chat(
        self, messages: list[ChatMessage], use_audio_in_video: bool = False
    ) -> PreparedPrompt:
        """Raises ``MediaError`` for a part that does not decode, is over a limit or cannot be
        fetched, and ``ProxyUnreachable`` when the media proxy cannot be connected to."""
        decoded: dict[str, Any] = {}
        if has_media_parts(messages):
            fetched = await self._fetch(messages)
            decoded = await asyncio.to_thread(
                decode_media, self.processor, messages, self.api, fetched, use_audio_in_video
            )
        prepare = functools.partial(prepare_prompt, family=self.family)
        return await self._on_processor_thread(
            prepare, self.processor, messages, self.api, decoded, use_audio_in_video
        )

    async def _fetch(self, messages: list[ChatMessage]) -> dict[str, bytes]:
        """The remote media URLs' files, when this server fetches them (on the loop: they
        wait on the network, not the CPU)."""
        if not self.api.allow_remote_urls:
            return {}
        return await fetch_media(remote_media(messages, self.api), self._fetch_policy)

    async def speech(self, text: str) -> tuple[PreparedPrompt, list[int]]:
        """The prompt of a text-to-speech request and the reply the Talker speaks: ``text``'s
        tokens and ``<|im_end|>``."""
        return await self._on_processor_thread(self._speech, text)

    def _speech(self, text: str) -> tuple[PreparedPrompt, list[int]]:
        message = ChatMessage(role="user", content=text)
        prompt = prepare_prompt(self.processor, [message], self.api, family=self.family)
        tokenizer = self.processor.tokenizer
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return prompt, tokenizer(text)["input_ids"] + [im_end]

    async def _on_processor_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._processor_thread, fn, *args)

    def close(self) -> None:
        self._processor_thread.shutdown(wait=False, cancel_futures=True)
