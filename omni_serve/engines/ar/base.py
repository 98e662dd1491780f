"""The AR engine contract: one request in, an async stream of token chunks out.

Both implementations (vLLM for the Thinker, the torch reference for the Talker and for fast
tests) speak it, so a deployment never knows which engine it drives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class PromptRejected(ValueError):
    """The engine refused the request's input (e.g. a prompt longer than its context): the
    caller's mistake, not the engine's failure."""


@dataclass
class SamplingConfig:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    repetition_penalty: float = 1.0
    # Text-level settings: vLLM's (its detokenizer finds stop strings; its sampler biases and
    # cuts); the torch engine, which decodes codec frames, has no text and takes none of them.
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False

    @property
    def text_level(self) -> list[str]:
        """The text-level settings this asks for, by name."""
        wanted = {
            "stop": self.stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logit_bias": self.logit_bias,
            "min_p": self.min_p,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
        }
        return [name for name, value in wanted.items() if value]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class ARRequest:
    """One generation request. Exactly one of ``prompt_token_ids`` / ``prompt_embeds``."""

    request_id: str
    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None  # [T, H]
    multi_modal_data: dict[str, Any] | None = None
    # Per-request settings of the model's multimodal processor (a video's ``fps``, say).
    mm_processor_kwargs: dict[str, Any] | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Decoder layers whose per-token hidden states the caller wants back (0 = input embeddings).
    capture_layers: tuple[int, ...] = ()
    # Model-specific inputs a StepRunner reads (e.g. the Talker's M-RoPE positions).
    extra: dict[str, Any] = field(default_factory=dict)
    # For the engine's KV connector (export this prompt's KV, or load a peer's prefix).
    kv_transfer_params: dict[str, Any] | None = None
    # Serve prompt tokens from caches (prefix cache, a loaded prefix). None: unless capturing,
    # since rows of cached tokens are never computed; a caller that has them already says so.
    read_cache: bool | None = None

    def __post_init__(self) -> None:
        if (self.prompt_token_ids is None) == (self.prompt_embeds is None):
            raise ValueError("give exactly one of prompt_token_ids or prompt_embeds")


@dataclass
class ARChunk:
    """What one engine step produced for one request."""

    request_id: str
    token_ids: list[int]  # new tokens in this chunk
    text: str = ""  # detokenized delta, where the engine detokenizes
    finished: bool = False
    finish_reason: str | None = None
    # layer -> rows [n, H] for positions not yet returned (prompt rows come with the first chunk)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    num_prompt_tokens: int = 0
    # Prompt tokens whose KV the engine did not compute (prefix cache or loaded from a peer).
    num_cached_tokens: int = 0
    # The prompt as the engine saw it (media placeholders expanded); on the first chunk only.
    prompt_token_ids: list[int] | None = None
    # Per-step model outputs beside the token (e.g. the Talker's 16 codec codes of a frame).
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    # What the KV connector answered (e.g. the exported prefix); on the final chunk only.
    kv_transfer_params: dict[str, Any] | None = None
    # How many of the reply's newest tokens a stop string may still reach into (while it goes
    # on) or did reach into (the final chunk); the text leaves those out (stop_strings.py).
    stop_tokens: int = 0


class AREngine(Protocol):
    async def start(self) -> None: ...

    def generate(self, request: ARRequest) -> AsyncIterator[ARChunk]: ...

    async def abort(self, request_id: str) -> None: ...

    async def shutdown(self) -> None: ...
