"""User story: a Qwen2.5-Omni voice conversation's next spoken turn reads the KV its last turn
left (on another replica, or in its own replica's cache), with the Thinker rows that turn kept
at every position of its prompt and reply standing in for those the cache skips: only the new
part is computed, and the Talker gets the rows and reply a from-scratch run gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.models.thinker_talker.messages import ThinkerRequest, from_wire, unpack_rows
from omni_serve.transport import take
from omni_serve.transport.kv_blocks import KVPrefix
from omni_serve.transport.session_prefixes import free_prefix
from tests.integration.thinker_replicas import two_replicas

pytestmark = pytest.mark.integration
BLOCK = 128  # vLLM's CPU block size
GREEDY = SamplingConfig(max_tokens=10, temperature=0.0, ignore_eos=True)
CONFIG = Path(__file__).parents[2] / "configs/pipelines/qwen2_5_omni_tiny.yaml"
# Decoded rows (a reply's, kept) against prefilled ones (a from-scratch run's): the same
# math in another kernel order.
ROW_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.fixture(scope="module")
async def replicas(tiny_qwen2_5_omni_path):
    async for pair in two_replicas(CONFIG, tiny_qwen2_5_omni_path):
        yield pair


async def _spoken_turn(replica, request_id: str, prompt: list[int], session_kv=None, session=True):
    """A spoken reply's Thinker turn: its tokens, cached count, export, and the rows the Talker
    gets (the prompt's, then the reply tokens')."""
    request = ThinkerRequest(
        request_id,
        prompt,
        GREEDY,
        capture=True,
        session_id="s-25" if session else None,
        session_kv=session_kv,
    )
    chunks = [from_wire(chunk) async for chunk in replica.generate(request)]
    (prompt_rows,) = [await take(c.prompt_rows) for c in chunks if c.prompt_rows is not None]
    (layer,) = prompt_rows
    reply_rows = torch.cat([unpack_rows(c.reply_rows) for c in chunks if c.reply_rows])
    tokens = [t for c in chunks for t in c.token_ids]
    rows = torch.cat([prompt_rows[layer], reply_rows])
    return tokens, chunks[0].num_cached_tokens, chunks[-1].session_kv, rows


def _conversation(seed: int) -> list[int]:
    return [(i * seed) % 250 + 10 for i in range(250)]


async def test_the_next_spoken_turn_elsewhere_loads_the_kv_and_the_kept_rows(replicas):
    first, second = replicas
    turn_one = _conversation(7919)
    reply, cached, exported, _ = await _spoken_turn(first, "t1", turn_one)
    assert cached == 0
    kept = KVPrefix.decode(exported).companion_meta
    assert kept["everywhere"] and kept["ids"][: len(turn_one)] == turn_one
    assert kept["ids"][len(turn_one) :] == reply[: len(kept["ids"]) - len(turn_one)]

    turn_two = [*turn_one, *reply, 42, 43, 44, 45]
    tokens, cached, exported_two, rows = await _spoken_turn(second, "t2", turn_two, exported)
    assert cached >= len(turn_one) // BLOCK * BLOCK > 0
    reference, ref_cached, _, ref_rows = await _spoken_turn(
        first, "t2-reference", turn_two, session=False
    )
    assert ref_cached == 0 and tokens == reference
    torch.testing.assert_close(rows, ref_rows, **ROW_TOLERANCE)
    free_prefix(exported_two)


async def test_the_next_spoken_turn_reads_its_replicas_cache_into_the_last_reply(replicas):
    """On the replica that ran turn one, its cache holds turn one's reply too (a whole block of
    it past the prompt here): the reply's kept rows stand in for it."""
    first, _ = replicas
    turn_one = _conversation(104729)
    reply, _, exported, _ = await _spoken_turn(first, "u1", turn_one)
    turn_two = [*turn_one, *reply, 42, 43, 44, 45]
    tokens, cached, exported_two, rows = await _spoken_turn(first, "u2", turn_two, exported)
    assert cached == (len(turn_one) + len(reply)) // BLOCK * BLOCK > len(turn_one)
    reference, ref_cached, _, ref_rows = await _spoken_turn(
        first, "u2-reference", turn_two, session=False
    )
    assert ref_cached == 0 and tokens == reference
    torch.testing.assert_close(rows, ref_rows, **ROW_TOLERANCE)
    free_prefix(exported_two)
