"""User story: a prompt longer than the Thinker's context is refused as the client's mistake
(the ingress answers 400 with vLLM's reason), not reported as a failed stage."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.base import ARRequest, PromptRejected, SamplingConfig

pytestmark = pytest.mark.integration


async def test_a_prompt_past_the_context_is_rejected_as_bad_input(vllm_thinker):
    too_long = ARRequest("too-long", prompt_token_ids=[11] * 5000, sampling=SamplingConfig())
    with pytest.raises(PromptRejected, match="maximum context length is 4096"):
        async for _ in vllm_thinker.generate(too_long):
            pass
    fits = ARRequest("fits", prompt_token_ids=[11] * 50, sampling=SamplingConfig(max_tokens=2))
    assert [c async for c in vllm_thinker.generate(fits)]  # the engine serves on
