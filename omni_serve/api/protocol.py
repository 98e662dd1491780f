"""OpenAI-compatible request/response models (the subset served so far)."""

from __future__ import annotations

import time
import uuid
import zlib
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from omni_serve.media.chat_parts import ChatMessage


class AudioOptions(BaseModel):
    voice: str = Field("ethan", description="Speaker voice.")
    format: Literal["wav", "pcm16", "flac", "mp3", "opus"] = Field(
        "wav", description="Encoding of the returned audio."
    )


class TalkerOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1, description="Most codec frames (12.5 per second).")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy.")
    top_k: int | None = Field(None, ge=-1, description="Top-k sampling; -1 or 0 = off.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    repetition_penalty: float | None = Field(None, gt=0.0, description="Penalty on repeats.")
    seed: int | None = Field(None, description="Seed of the Talker's sampling.")


class StageOverrides(BaseModel):
    model_config = ConfigDict(extra="forbid")

    talker: TalkerOverrides | None = Field(None, description="Talker (speech codes) sampling.")


class StreamOptions(BaseModel):
    include_usage: bool = Field(False, description="Send usage in the last chunk.")


class MmProcessorKwargs(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a setting this server does not take: a 400

    use_audio_in_video: bool = Field(False, description="As the request's use_audio_in_video.")


def stage_seed(seed: int, stage: str) -> int:
    """A stage's own seed from the request's: stable across processes (unlike ``hash``), and
    different per stage, so two stages never draw the same stream."""
    return zlib.crc32(f"{seed}:{stage}".encode()) & 0x7FFFFFFF


class OmniExtensions(BaseModel):
    """Fields omni-serve adds to OpenAI's speech-producing requests."""

    stage_overrides: StageOverrides | None = Field(
        None, description="omni-serve extension: per-stage settings (e.g. Talker sampling)."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="omni-serve extension: server-side deadline in seconds (capped by the "
        "server's api.request_timeout_s); past it the request is cancelled in every stage.",
    )
    session_id: str | None = Field(
        None,
        max_length=256,
        description="omni-serve extension: requests with the same session id go to the same "
        "Thinker replica (its prefix cache holds the conversation) while it has room.",
    )

    def talker_sampling(self, seed: int | None = None) -> dict[str, Any]:
        """The Talker's sampling settings this request overrides. With the request's ``seed``
        and no Talker seed of its own, the Talker's seed is derived from it, so one seed
        reproduces the whole reply, speech included."""
        talker = self.stage_overrides.talker if self.stage_overrides else None
        settings = talker.model_dump(exclude_none=True) if talker else {}
        if seed is not None and "seed" not in settings:
            settings["seed"] = stage_seed(seed, "talker")
        return settings


MAX_LOGIT_BIAS_TOKENS = 300


class ChatCompletionRequest(OmniExtensions):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(description="Served model id (see GET /v1/models).")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    modalities: list[Literal["text", "audio", "image"]] = Field(
        default_factory=lambda: ["text"],
        description="Output modalities: text and audio (Qwen3-Omni) or image (Qwen-Image).",
    )
    audio: AudioOptions | None = Field(None, description="Audio output options.")
    max_tokens: int | None = Field(None, ge=1, description="Most text tokens to generate.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Alias of max_tokens.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature (0=greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(None, description="Sampling seed.")
    stream: bool = Field(False, description="Stream the response as server-sent events.")
    stream_options: StreamOptions | None = Field(None, description="Streaming options.")
    stop: str | list[str] | None = Field(
        None,
        validate_default=True,  # None becomes [] too
        description="Up to 4 sequences where the text stops (not included in it).",
    )
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Penalty on tokens that appeared in the reply so far."
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Penalty on tokens by how often they appeared so far."
    )
    prompt_cache_key: str | None = Field(
        None,
        max_length=256,
        description="OpenAI's prefix-cache hint: requests with the same key go to the same "
        "Thinker replica, whose prefix cache holds what they share (session_id does this "
        "too, and hands a conversation's KV over between turns).",
    )
    logit_bias: dict[str, float] | None = Field(
        None,
        description="Added to the Thinker's logits per token id (OpenAI's form: ids as "
        "strings), each -100..100, at most 300 tokens.",
    )
    top_k: int = Field(-1, ge=-1, description="vLLM extension: top-k sampling; -1 or 0 = off.")
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=2.0, description="vLLM extension: penalty on repeated tokens (1 = off)."
    )
    min_p: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="vLLM extension: tokens less likely than this fraction of the likeliest "
        "one are never drawn (0 = off).",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        description="vLLM extension: neither the end of the turn nor a stop sequence ends the "
        "reply before this many tokens.",
    )
    ignore_eos: bool = Field(
        False,
        description="vLLM extension: the reply goes on past the end of the turn, to max_tokens "
        "(what benchmarks that fix reply lengths send).",
    )
    n: int = Field(1, ge=1, description="Choices to generate; this server makes 1.")
    logprobs: bool = Field(False, description="Not offered by this server: true is a 400.")
    top_logprobs: int | None = Field(
        None, description="Not offered by this server: above 0 is a 400."
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="Not offered by this server: a non-empty list is a 400."
    )
    functions: list[dict[str, Any]] | None = Field(
        None, description="OpenAI's older tools: a non-empty list is a 400, as tools is."
    )
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="Only 'none' or 'auto': one that asks for a call is a 400."
    )
    function_call: str | dict[str, Any] | None = Field(
        None, description="OpenAI's older tool_choice: only 'none' or 'auto'."
    )
    web_search_options: dict[str, Any] | None = Field(
        None, description="Not offered by this server: present is a 400."
    )
    response_format: dict[str, Any] | None = Field(
        None, description="Only {'type': 'text'} (the default): structured output is a 400."
    )
    use_audio_in_video: bool = Field(
        False,
        description="omni-serve extension: the model also hears each video's audio track, "
        "interleaved with its frames in time (as Qwen3-Omni was trained to); the request's "
        "audio then comes from its videos only.",
    )
    mm_processor_kwargs: MmProcessorKwargs | None = Field(
        None, description="vLLM's form of use_audio_in_video, for clients written for vLLM."
    )

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, biases: dict[str, float] | None) -> dict[str, float] | None:
        if biases is None:
            return None
        if len(biases) > MAX_LOGIT_BIAS_TOKENS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS_TOKENS} tokens, not {len(biases)}")
        for token, bias in biases.items():
            if not token.isdigit():
                raise ValueError(f"keys are token ids, not {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases are -100..100, not {bias} (token {token})")
        return biases

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("at most 4 stop sequences, none of them empty")
        return stops

    def unsupported(self) -> tuple[str, str] | None:
        """(param, reason) of an OpenAI setting this server does not honour but was asked
        for: a 400, not an answer that silently ignores it."""
        if self.n != 1:
            return "n", "this server generates 1 choice per request (n=1)"
        if self.logprobs or self.top_logprobs:
            param = "logprobs" if self.logprobs else "top_logprobs"
            return param, "this server does not return logprobs"
        for param in ("tools", "functions"):
            if getattr(self, param):
                return param, "this server does not call tools"
        for param in ("tool_choice", "function_call"):
            if getattr(self, param) not in (None, "none", "auto"):
                return param, "this server does not call tools (only 'none' or 'auto')"
        if self.web_search_options is not None:
            return "web_search_options", "this server does not search the web"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format", "this server has no structured output (only type 'text')"
        return None

    @property
    def token_biases(self) -> dict[int, float] | None:
        """``logit_bias`` keyed by token id, as the Thinker's sampler takes it."""
        return {int(t): b for t, b in self.logit_bias.items()} if self.logit_bias else None

    @property
    def hears_video_audio(self) -> bool:
        vllm_form = self.mm_processor_kwargs and self.mm_processor_kwargs.use_audio_in_video
        return self.use_audio_in_video or bool(vllm_form)


def model_card(model_id: str, created: int) -> dict[str, Any]:
    """``GET /v1/models/{id}``, and the one entry of ``GET /v1/models``: one pipeline serves
    one model."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "omni-serve"}


def model_list(model_id: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(model_id, created)]}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def chat_completion_response(
    model: str, text: str, audio: dict[str, Any] | None, finish_reason: str, usage: dict
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        message["audio"] = audio
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }


def error_body(
    message: str,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage; ``prompt_tokens_details.cached_tokens``: prompt tokens the Thinker did
    not compute (its prefix cache, or a prefix another replica computed)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class TokenCounts(Protocol):
    """What a finished reply knows of its tokens (the Qwen3-Omni pipeline's ``ChatResult``)."""

    prompt_tokens: int
    token_ids: list[int]
    cached_tokens: int


def reply_usage(result: TokenCounts) -> dict:
    """``usage_dict`` of a finished reply, the same in a response body and a stream's last chunk."""
    return usage_dict(result.prompt_tokens, len(result.token_ids), result.cached_tokens)
