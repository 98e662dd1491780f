"""User story: the next turn of a text conversation reuses the Thinker's prefix cache, while
a request that captures hidden rows for the Talker still gets a row for every prompt token."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.base import ARRequest, SamplingConfig

pytestmark = pytest.mark.integration
BLOCK = 128  # vLLM's CPU block size
PROMPT = [(i * 7919) % 250 + 10 for i in range(300)]


async def _run(engine, request_id: str, layers: tuple[int, ...]):
    request = ARRequest(
        request_id,
        prompt_token_ids=PROMPT,
        sampling=SamplingConfig(max_tokens=2),
        capture_layers=layers,
    )
    chunks = [chunk async for chunk in engine.generate(request)]
    rows = sum(c.hidden[0].shape[0] for c in chunks if c.hidden)
    return chunks[0].num_cached_tokens, rows


async def test_a_repeated_prompt_hits_the_cache_unless_it_captures(vllm_thinker):
    await _run(vllm_thinker, "prefix-first", ())
    cached, rows = await _run(vllm_thinker, "prefix-again", ())
    assert cached == len(PROMPT) // BLOCK * BLOCK and rows == 0
    cached, rows = await _run(vllm_thinker, "prefix-captured", (0, 1))
    assert cached == 0
    assert rows >= len(PROMPT)  # every prompt row (plus the generated tokens')
