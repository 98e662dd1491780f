"""A ``RealtimeSession`` served by uvicorn on a free port, for the official ``openai`` client,
answering through a scripted chat path (``ScriptedChat``): the protocol is what these tests
prove; the model's answers are the served tests'
(tests/integration/served_qwen3_omni/test_realtime.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, WebSocket

from omni_serve.api.errors import ApiError, ContextOverflow
from omni_serve.api.realtime.session import RealtimeSession
from omni_serve.api.realtime.settings import Ask, Limits

LIMITS = Limits(
    "omni-test",
    frozenset({"ethan", "chelsie"}),
    max_tokens=64,
    default_tokens=16,
    languages=frozenset({"en", "fr"}),
    audio_items=4,  # Qwen3-Omni's vLLM default
)


@dataclass
class Event:
    kind: str
    text: str = ""
    audio: np.ndarray | None = None
    result: Any = None


@dataclass
class Result:
    prompt_tokens: int
    token_ids: list[int]
    cached_tokens: int = 0
    finish_reason: str = "stop"
    timings: dict = field(default_factory=lambda: {"e2e_s": 0.1})


@dataclass
class ScriptedChat:
    """Answers each ask with ``words`` (one text event each) and, when spoken, one 40 ms audio
    chunk per word, ``gap_s`` apart; ``endless`` keeps speaking until it is closed."""

    words: list[str] = field(default_factory=lambda: ["Hello", " there."])
    gap_s: float = 0.0
    endless: bool = False
    refuse: ApiError | None = None
    fail_after: int | None = None  # words, then a stage fails mid-answer
    early_answer_ms: int | None = None  # the sessions' setting
    start_cushion_s: float = 0.0  # the sessions' setting
    asks: list[Ask] = field(default_factory=list)
    asked_at: list[float] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)  # when each answer's stream was closed
    heard_words: list[str] = field(default_factory=lambda: ["What", " is", " it?"])
    transcribed: list[tuple[bytes, Any]] = field(default_factory=list)  # (clip, settings)
    refuse_transcript: Exception | None = None
    transcript_gap_s: float = 0.0  # between the transcript's words
    transcripts_closed: list[float] = field(default_factory=list)
    # a context this small, a prompt counted one token per character of its messages' text
    context_tokens: int | None = None
    overflows: int = 0  # asks refused as over the context
    conversation_bytes: int | None = None  # the sessions' Limits.conversation_bytes

    async def __call__(self, ask: Ask):
        if self.refuse is not None:
            raise self.refuse
        if self.context_tokens is not None:
            n = prompt_tokens(ask.messages)
            if n + ask.reply_room > self.context_tokens:
                self.overflows += 1
                raise ContextOverflow(n, self.context_tokens, ask.reply_room)
        self.asks.append(ask)
        self.asked_at.append(time.monotonic())
        return self._events(ask)

    async def transcribe(self, pcm: bytes, settings):
        """A committed turn's transcript: ``heard_words``, one text event each."""
        if self.refuse_transcript is not None:
            raise self.refuse_transcript
        self.transcribed.append((pcm, settings))

        async def events():
            try:
                for word in self.heard_words:
                    yield Event("text", text=word)
                    await asyncio.sleep(self.transcript_gap_s)
                yield Event("done", result=Result(11, list(range(len(self.heard_words)))))
            finally:
                self.transcripts_closed.append(time.monotonic())

        return events()

    async def _events(self, ask: Ask):
        try:
            i = 0
            while i < len(self.words) or self.endless:
                yield Event("text", text=self.words[i % len(self.words)])
                if ask.audio:
                    yield Event("audio", audio=np.full(960, 0.1 * (i % 3 + 1), np.float32))
                i += 1
                if i == self.fail_after:
                    raise RuntimeError("the talker replica died")
                await asyncio.sleep(self.gap_s)
            yield Event("done", result=Result(7, list(range(i))))
        finally:
            self.closed.append(time.monotonic())


def prompt_tokens(messages: list[dict]) -> int:
    """One token per character of text (100 for an audio part)."""

    def size(content: str | list[dict]) -> int:
        if isinstance(content, str):
            return len(content)
        return sum(len(part.get("text", "")) or 100 for part in content)

    return sum(size(m["content"]) for m in messages)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def realtime_server():
    """(base_url, chat): a server whose sessions answer with ``chat``."""
    chat = ScriptedChat()
    app = FastAPI()

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket, model: str | None = None):
        await ws.accept()
        session = RealtimeSession(
            ws,
            chat,
            dataclasses.replace(LIMITS, conversation_bytes=chat.conversation_bytes),
            idle_timeout_s=30,
            max_buffer_bytes=2_000_000,
            early_answer_ms=chat.early_answer_ms,
            transcribe=chat.transcribe,
            start_cushion_s=lambda: chat.start_cushion_s,
        )
        try:
            await session.run()
        finally:
            await session.close()

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/v1", chat
    server.should_exit = True
    thread.join(5)
