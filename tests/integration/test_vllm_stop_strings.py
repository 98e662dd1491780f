"""User story: a stage that follows the Thinker's tokens as they come (the Talker speaking the
reply) gets each token as soon as no stop string can reach into it, and never one that the
stop string ending the reply took back."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.models.thinker_talker.thinker_inputs import thinker_prompt
from tests.reference import prompt_messages

pytestmark = pytest.mark.integration


async def followed_per_chunk(engine, processor, name: str, stop: list[str]):
    """The reply's tokens, and after each chunk how many had come and how many of them a
    follower may hear."""
    ids, _ = thinker_prompt(processor, prompt_messages("text"))
    sampling = SamplingConfig(max_tokens=32, stop=stop)
    heard, counts = [], []
    async for chunk in engine.generate(ARRequest(name, prompt_token_ids=ids, sampling=sampling)):
        heard += chunk.token_ids
        counts.append((len(heard), len(heard) - chunk.stop_tokens))
    return heard, counts


async def test_a_follower_hears_every_token_no_stop_string_can_reach(vllm_thinker, omni_processor):
    reply, _ = await followed_per_chunk(vllm_thinker, omni_processor, "free", [])

    def text(n: int) -> str:
        return omni_processor.tokenizer.decode(reply[:n], skip_special_tokens=True)

    k = next(
        k
        for k in range(1, len(reply) - 2)
        if len(text(k)) < len(text(k + 1)) < len(text(k + 2))
        and "\ufffd" not in text(k + 2)[len(text(k)) :]
        and text(len(reply)).index(text(k + 2)[len(text(k)) :]) == len(text(k))
    )
    stop = text(k + 2)[len(text(k)) :]  # what tokens k+1 and k+2 spell
    heard, counts = await followed_per_chunk(vllm_thinker, omni_processor, "stop", [stop])
    followed = [f for _, f in counts]
    assert heard == reply[: k + 2]  # vLLM keeps the string's tokens
    assert followed == sorted(followed) and followed[-1] == k  # never the string's tokens

    # A long stop string the reply never begins holds nothing back (holding as many tokens
    # as it has bytes would keep a follower 42 tokens behind, past this whole reply).
    never = ["\x07 never said \x07" * 3]
    heard, counts = await followed_per_chunk(vllm_thinker, omni_processor, "never", never)
    assert heard == reply and counts[-1] == (len(reply), len(reply))
    for n, f in counts:  # only tokens ending inside a character wait for the next one
        whole = len(text(n)) - text(n).endswith("\ufffd")
        assert f == max(j for j in range(n + 1) if len(text(j)) <= whole), (n, f, text(n))
