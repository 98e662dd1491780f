"""User story: a multi-turn session's next turn lands on another Thinker replica, and that
replica loads the prefix KV the first one computed (over the tensor channel) instead of running
its prefill again, with the same tokens out."""

from __future__ import annotations

import asyncio
import re

import pytest
import torch

from omni_serve.engines.ar.kv_layout import dense_kv
from omni_serve.engines.ar.vllm_engine import channel_kv_transfer_config
from omni_serve.transport import take
from omni_serve.transport.kv_blocks import KVPrefix

pytestmark = pytest.mark.integration

# The tiny model's blocks would fit inline (refs that carry their payload): shared memory is
# what a real model's blocks take on one host, and what can be taken only once.
KV = channel_kv_transfer_config("shared_memory")
BLOCK = 128  # vLLM's CPU block size
PROMPT = [(i * 7919) % 250 + 10 for i in range(1000)]


@pytest.fixture(scope="module")
def engines(tiny_omni_path):
    """Two engines of one model: ``first`` computes (prefix caching off, so every run of it is
    a from-scratch reference), ``second`` imports."""
    from vllm import LLM

    from omni_serve.engines.ar.vllm_engine import DEFAULT_ENGINE_ARGS

    args = {k: v for k, v in DEFAULT_ENGINE_ARGS.items() if k != "limit_mm_per_prompt"}
    first = LLM(str(tiny_omni_path), kv_transfer_config=KV, enable_prefix_caching=False, **args)
    second = LLM(str(tiny_omni_path), kv_transfer_config=KV, **args)
    assert first.llm_engine.vllm_config.cache_config.block_size == BLOCK
    yield first, second
    for engine in (first, second):
        engine.llm_engine.engine_core.shutdown()


def _run(engine, prompt: list[int], kv_params: dict | None = None, max_tokens: int = 6):
    from vllm import SamplingParams

    extra = {"kv_transfer_params": kv_params} if kv_params else None
    params = SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra)
    out = engine.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), out.num_cached_tokens, out.kv_transfer_params


@pytest.mark.parametrize("max_tokens", [1, 6], ids=["finishes_in_prefill", "decodes"])
def test_the_second_engine_loads_the_prefix_and_answers_the_same(engines, max_tokens):
    first, second = engines
    _, _, exported = _run(first, PROMPT, {"omni_kv_export": True}, max_tokens=max_tokens)
    assert exported and exported["omni_kv"], exported
    turn_two = [*PROMPT, 11, 12, 13 + max_tokens]  # unique per case: no local cache hit
    tokens, cached, _ = _run(second, turn_two, {"omni_kv": exported["omni_kv"]})
    assert cached == 1000 // BLOCK * BLOCK  # every whole block of the first prompt
    reference, reference_cached, _ = _run(first, turn_two)
    assert reference_cached == 0 and tokens == reference


def test_only_the_blocks_before_the_first_different_token_load(engines):
    first, second = engines
    prompt = [*PROMPT[:600], 20, 21, 22, 23]
    _, _, exported = _run(first, prompt, {"omni_kv_export": True})
    diverged = [*prompt[:300], 99, *prompt[301:]]
    tokens, cached, _ = _run(second, diverged, {"omni_kv": exported["omni_kv"]})
    assert cached == 2 * BLOCK  # block 2 holds the changed token
    assert tokens == _run(first, diverged)[0]


def test_a_prefix_taken_already_is_recomputed_not_a_failure(engines):
    first, second = engines
    prompt = [*PROMPT[:700], 30, 31]
    _, _, exported = _run(first, prompt, {"omni_kv_export": True})
    _run(second, [*prompt, 1], {"omni_kv": exported["omni_kv"]})  # takes the ref
    # The first engine (no prefix cache) tries the same ref: gone, so it computes instead
    # (without the recompute policy the request fails; without reporting the failed blocks
    # it decodes from blocks nobody wrote).
    tokens, _, _ = _run(first, [*prompt, 2], {"omni_kv": exported["omni_kv"]})
    assert tokens == _run(first, [*prompt, 2])[0]


def test_exported_blocks_read_back_as_the_models_own_keys_and_values(engines, hf_omni):
    """User story: a stage that attends to an AR stage's KV (a DiT conditioned on the Thinker)
    reads the exported blocks as the keys and values transformers' model computes itself."""
    first, _ = engines
    prompt = [*PROMPT[:300], 40]
    _, _, exported = _run(first, prompt, {"omni_kv_export": True}, max_tokens=1)
    prefix = KVPrefix.decode(exported["omni_kv"])
    assert prefix.layout == "CPU_ATTN/vec"  # fp32 on a CPU without AMX, as in CI
    dense = dense_kv(asyncio.run(take(prefix.ref)), prefix.layout)
    with torch.no_grad():
        cache = hf_omni.thinker(input_ids=torch.tensor([prompt]), use_cache=True).past_key_values
    tokens = 2 * BLOCK  # the whole blocks of 301 tokens
    assert len(dense) == len(cache.layers)
    for name, (keys, values) in dense.items():
        layer = cache.layers[int(re.search(r"layers\.(\d+)\.", name).group(1))]
        # transformers: [batch, kv_heads, tokens, head_size]; dense: [tokens, kv_heads, ...]
        torch.testing.assert_close(keys, layer.keys[0, :, :tokens].transpose(0, 1))
        torch.testing.assert_close(values, layer.values[0, :, :tokens].transpose(0, 1))
