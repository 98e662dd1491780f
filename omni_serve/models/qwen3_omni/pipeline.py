"""One Qwen3-Omni chat request across the stages: Thinker → (Talker → Code2wav).

Stage access is abstract (``StageClients``) so the flow runs the same over Serve handles and
over in-process engines in tests. Heavy tensors (the Thinker's prompt rows) travel as opaque
references the Talker resolves; the orchestrator never touches their bytes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from omni_serve.models.qwen3_omni.request import PreparedPrompt


class StageClients(Protocol):
    def thinker(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    def talker(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    async def code2wav(self, codes: Any) -> np.ndarray: ...


@dataclass
class ChatResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    audio: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


async def run_chat(
    clients: StageClients,
    prompt: PreparedPrompt,
    sampling: dict[str, Any],
    want_audio: bool,
    voice: str,
    request_id: str,
    talker_sampling: dict[str, Any] | None = None,
) -> ChatResult:
    start = time.perf_counter()
    thinker_request = {
        "request_id": request_id,
        "prompt_ids": prompt.prompt_ids,
        "multi_modal_data": prompt.multi_modal_data,
        "sampling": sampling,
        "capture": want_audio,
    }
    text, tokens, rows, reason, n_prompt = [], [], None, "stop", len(prompt.prompt_ids)
    expanded_ids = prompt.prompt_ids  # media placeholders expanded by the Thinker's processor
    async for chunk in clients.thinker(thinker_request):
        expanded_ids = chunk.get("prompt_token_ids") or expanded_ids
        text.append(chunk["text"])
        tokens += chunk["token_ids"]
        rows = chunk.get("prompt_rows") or rows
        if chunk["finished"]:
            reason = chunk["finish_reason"] or "stop"
            n_prompt = chunk["num_prompt_tokens"] or n_prompt
    result = ChatResult("".join(text), tokens, reason, n_prompt)
    result.timings["thinker_s"] = time.perf_counter() - start
    if not want_audio or not tokens:
        return result
    talker_request = {
        "request_id": request_id,
        "prompt_ids": expanded_ids,
        "prompt_rows": rows,
        "tokens": tokens,
        "voice": voice,
        "sampling": talker_sampling or {},
        "image_grid_thw": prompt.image_grid_thw,
        "audio_seqlens": prompt.audio_seqlens,
    }
    frames = []
    async for chunk in clients.talker(talker_request):
        frames.append(chunk["codes"])
    result.timings["talker_s"] = time.perf_counter() - start - result.timings["thinker_s"]
    if frames:
        result.audio = await clients.code2wav(frames)
    result.timings["total_s"] = time.perf_counter() - start
    return result
