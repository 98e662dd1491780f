"""User story: a conversation's next turn lands on another Thinker replica, which loads the KV
its previous turn computed on the first replica instead of prefilling it again, and answers the
same; on the replica that holds the prefix already, the handed-over copy is just freed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omni_serve.config.kv_store import KVStoreConfig
from omni_serve.engines.ar.base import SamplingConfig
from omni_serve.kv_store.content_key import PromptContent
from omni_serve.kv_store.tiered_store import TieredPrefixStore
from omni_serve.models.thinker_talker.messages import ThinkerRequest, from_wire
from omni_serve.testing.abuse import wait_for
from omni_serve.testing.leaks import shm_usage
from omni_serve.transport import make_channel, release, take
from omni_serve.transport import shared_memory as shm
from omni_serve.transport.kv_blocks import EXPORT_KEY, PREFIX_KEY, KVPrefix
from omni_serve.transport.session_prefixes import free_prefix
from tests.integration.thinker_replicas import two_replicas

pytestmark = pytest.mark.integration
BLOCK = 128  # vLLM's CPU block size
TURN_ONE = [(i * 7919) % 250 + 10 for i in range(300)]
TURN_TWO = [*TURN_ONE, 42, 43, 44, 45, 46]
GREEDY = SamplingConfig(max_tokens=4, temperature=0.0)
CONFIG = Path(__file__).parents[2] / "configs/pipelines/qwen3_omni_tiny.yaml"


@pytest.fixture(scope="module")
async def replicas(tiny_omni_path):
    async for pair in two_replicas(CONFIG, tiny_omni_path):
        yield pair


async def _turn(
    replica, request_id: str, prompt: list[int], session_kv: str | None = None, **extra
):
    request = ThinkerRequest(
        request_id, prompt, GREEDY, session_id="s-1", session_kv=session_kv, **extra
    )
    chunks = [from_wire(chunk) async for chunk in replica.generate(request)]
    tokens = [t for c in chunks for t in c.token_ids]
    return tokens, chunks[0].num_cached_tokens, chunks[-1].session_kv


async def _spoken_turn(
    replica, request_id: str, prompt: list[int], clips: torch.Tensor, session_kv=None, session=True
):
    """A spoken reply to a prompt whose audio the encoder stage encoded (``clips``: its rows)."""
    request = ThinkerRequest(
        request_id,
        prompt,
        GREEDY,
        capture=True,
        session_id="s-2" if session else None,
        session_kv=session_kv,
        audio_rows=make_channel("inline").put(clips.clone()),
    )
    chunks = [from_wire(chunk) async for chunk in replica.generate(request)]
    (rows,) = [await take(c.prompt_rows) for c in chunks if c.prompt_rows is not None]
    tokens = [t for c in chunks for t in c.token_ids]
    return tokens, chunks[0].num_cached_tokens, chunks[-1].session_kv, rows


def _voice_chat(replica, seed: int, start: int) -> tuple[torch.Tensor, list[int], list[int]]:
    """Two spoken turns' prompts (a clip of 150 rows in turn one, 40 more in turn two) and the
    rows the encoder stage gave for their clips."""
    audio, hidden = replica.audio_token_id, replica.embed_tokens.shape[1]
    clips = torch.randn(190, hidden, generator=torch.Generator().manual_seed(seed))
    turn_one = [
        *TURN_ONE[start : start + 100],
        *[audio] * 150,
        *TURN_ONE[start + 100 : start + 200],
    ]
    turn_two = [*turn_one, *TURN_ONE[:30], *[audio] * 40, *TURN_ONE[30:50]]
    return clips, turn_one, turn_two


def _freed(encoded: str, companion: bool = False) -> bool:
    prefix = KVPrefix.decode(encoded)
    ref = prefix.companion if companion else prefix.ref
    with open(shm.SHM_DIR / ref.key, "rb") as f:
        generation, state, _ = shm.HEADER.unpack(f.read(shm.HEADER.size))
    return generation != ref.handle[1] or state == shm.FREE


async def test_the_next_turn_on_another_replica_loads_the_prefix(replicas):
    first, second = replicas
    _, cached, exported = await _turn(first, "t1", TURN_ONE)
    assert cached == 0 and exported
    loaded = _shared_memory_takes(await second.engine.channel_stats())
    tokens, cached, _ = await _turn(second, "t2-elsewhere", TURN_TWO, exported)
    assert cached == len(TURN_ONE) // BLOCK * BLOCK  # second never saw this conversation
    assert _freed(exported)  # taken once
    # ... by vLLM's worker, which /metrics sees through the Thinker's stats()
    assert _shared_memory_takes(await second.engine.channel_stats()) == loaded + 1
    assert _shared_memory_takes((await second.stats())["channel"]) >= loaded + 1
    reference, _, _ = await _turn(first, "t2-reference", TURN_TWO)  # first computed turn one
    assert tokens == reference


def _shared_memory_takes(channel: dict) -> int:
    return channel["taken"].get("shared_memory", {}).get("payloads", 0)


async def test_the_replica_holding_the_prefix_frees_the_copy(replicas):
    first, _ = replicas
    prompt = [(i * 31) % 250 + 10 for i in range(300)]
    _, _, exported = await _turn(first, "same-1", prompt)
    assert exported and not _freed(exported)
    _, cached, _ = await _turn(first, "same-2", [*prompt, 7, 8], exported)
    assert cached == len(prompt) // BLOCK * BLOCK  # from its own prefix cache
    assert _freed(exported)  # not left to wait for the lease


async def test_an_audio_turn_the_encoder_stage_encoded_hands_its_prefix_over_too(replicas):
    """The encoder stage's rows make the turn an embeddings prompt (no token ids for vLLM):
    the prefix still moves, and only into a prompt with the same audio."""
    first, second = replicas
    audio = first.audio_token_id
    prompt = [*TURN_ONE[:100], *[audio] * 150, *TURN_ONE[100:200]]
    rows = torch.randn(150, first.embed_tokens.shape[1], generator=torch.Generator().manual_seed(0))

    def with_rows(rows: torch.Tensor) -> dict:
        return {"audio_rows": make_channel("inline").put(rows.clone())}

    _, cached, exported = await _turn(first, "a1", prompt, **with_rows(rows))
    assert cached == 0 and exported
    turn_two = [*prompt, 42, 43, 44]
    tokens, cached, _ = await _turn(second, "a2-elsewhere", turn_two, exported, **with_rows(rows))
    assert cached == len(prompt) // BLOCK * BLOCK and _freed(exported)
    reference, _, _ = await _turn(first, "a2-reference", turn_two, **with_rows(rows))
    assert tokens == reference

    _, _, exported = await _turn(first, "b1", prompt, **with_rows(rows))
    other = rows + 1  # same placeholders, other audio
    _, cached, _ = await _turn(second, "b2-other-audio", turn_two, exported, **with_rows(other))
    assert cached == 0 and _freed(exported)


def test_a_turn_that_captures_rows_without_kept_rows_loads_nothing(replicas):
    first, _ = replicas
    params = first.turns.kv_params(ThinkerRequest("r", [1], GREEDY, session_id="s-1"), True)
    assert params == {EXPORT_KEY: True}  # exports for the next turn, loads nothing
    no_session = ThinkerRequest("r", [1], GREEDY)
    assert first.turns.kv_params(no_session, capturing=False) is None
    assert PREFIX_KEY not in (params or {})


async def test_a_spoken_turn_with_audio_loads_the_prefix_and_its_kept_rows_elsewhere(replicas):
    """A voice conversation's next spoken turn on another replica: turn one's KV is loaded and
    its clip's rows come from what turn one kept; only the new part is computed, and the Talker
    gets the rows a from-scratch run gives."""
    first, second = replicas
    exports_before = shm_usage().in_use  # the engines' KV exports (other processes' segments)
    audio, hidden = first.audio_token_id, first.embed_tokens.shape[1]
    g = torch.Generator().manual_seed(1)
    clips = torch.randn(190, hidden, generator=g)  # turn one's clip (150 rows), turn two's (40)
    turn_one = [*TURN_ONE[:100], *[audio] * 150, *TURN_ONE[100:200]]  # 350 tokens
    turn_two = [*turn_one, *TURN_ONE[200:230], *[audio] * 40, *TURN_ONE[230:250]]  # 440
    _, cached, exported, _ = await _spoken_turn(first, "v1", turn_one, clips[:150])
    assert cached == 0 and KVPrefix.decode(exported).companion is not None

    tokens, cached, exported_two, rows = await _spoken_turn(
        second, "v2-elsewhere", turn_two, clips, exported
    )
    assert cached == len(turn_one) // BLOCK * BLOCK
    assert _freed(exported) and _freed(exported, companion=True)  # both taken
    reference, ref_cached, _, ref_rows = await _spoken_turn(
        first, "v2-reference", turn_two, clips, session=False
    )
    assert ref_cached == 0 and tokens == reference
    media = torch.tensor(turn_two) == audio  # the Talker reads the accept layer only there
    torch.testing.assert_close(
        rows[first.turns.accept_layer][media], ref_rows[first.turns.accept_layer][media]
    )
    torch.testing.assert_close(rows[0][~media], ref_rows[0][~media])

    # Turn one's rows again, on the replica whose cache holds turn two (its second clip
    # included): cached media the rows do not cover, so the turn runs again without caches.
    _, _, exported_one, _ = await _spoken_turn(first, "v1-again", turn_one, clips[:150])
    turn_three = [*turn_two, *TURN_ONE[250:260]]
    tokens, cached, exported_three, rows = await _spoken_turn(
        second, "v3", turn_three, clips, exported_one
    )
    assert cached == 0
    reference, _, _, ref_rows = await _spoken_turn(
        first, "v3-reference", turn_three, clips, session=False
    )
    assert tokens == reference
    media = torch.tensor(turn_three) == audio
    torch.testing.assert_close(
        rows[first.turns.accept_layer][media], ref_rows[first.turns.accept_layer][media]
    )
    assert _freed(exported_one, companion=True)
    for encoded in (exported_two, exported_three):
        free_prefix(encoded)
        assert _freed(encoded) and _freed(encoded, companion=True)
    # Nothing else left in use: the export of v3's first (aborted) run was freed too.
    wait_for(lambda: shm_usage().in_use == exports_before, 10, "exports handed back")


async def test_a_spoken_turn_whose_kept_rows_are_gone_answers_without_caches(replicas):
    """The kept rows' buffer is gone (the replica that kept them died, say): the turn still
    answers the same, computing its whole prompt."""
    first, _ = replicas
    audio = first.audio_token_id
    clips, turn_one, turn_two = _voice_chat(first, seed=2, start=50)
    _, _, exported, _ = await _spoken_turn(first, "w1", turn_one, clips[:150])
    release(KVPrefix.decode(exported).companion)
    tokens, cached, exported_two, rows = await _spoken_turn(first, "w2", turn_two, clips, exported)
    assert cached == 0  # its own cache held turn one, but no rows for it
    reference, _, _, ref_rows = await _spoken_turn(first, "w2-ref", turn_two, clips, session=False)
    assert tokens == reference
    media = torch.tensor(turn_two) == audio
    torch.testing.assert_close(
        rows[first.turns.accept_layer][media], ref_rows[first.turns.accept_layer][media]
    )
    free_prefix(exported_two)


async def test_a_turn_whose_prefix_is_gone_answers_without_caches_and_says_so(replicas):
    """The replica that exported turn one's KV is gone (scaled down: its segments went with
    it), which only the read finds out: turn two computes its prompt, reports no cached
    tokens, and answers the same. vLLM 0.32 would report the promised tokens as cached."""
    first, second = replicas
    prompt = [(i * 17) % 250 + 10 for i in range(300)]
    _, _, exported = await _turn(first, "gone-1", prompt)
    release(KVPrefix.decode(exported).ref)
    tokens, cached, _ = await _turn(second, "gone-2", [*prompt, 5, 6], exported)
    reference, _, _ = await _turn(first, "gone-2-reference", [*prompt, 5, 6])
    assert cached == 0 and tokens == reference


async def test_a_spoken_turn_whose_prefix_is_gone_gives_the_talker_the_right_rows(replicas):
    """As above for a spoken turn whose kept rows are still there: the rows the Talker gets
    are those of a from-scratch run, not rows of the failed load's forward in their place."""
    first, second = replicas
    audio = first.audio_token_id
    clips, turn_one, turn_two = _voice_chat(first, seed=3, start=20)
    _, _, exported, _ = await _spoken_turn(first, "x1", turn_one, clips[:150])
    release(KVPrefix.decode(exported).ref)  # the KV is gone, the kept rows are not
    tokens, cached, exported_two, rows = await _spoken_turn(
        second, "x2-elsewhere", turn_two, clips, exported
    )
    reference, _, _, ref_rows = await _spoken_turn(first, "x2-ref", turn_two, clips, session=False)
    assert cached == 0 and tokens == reference
    media = torch.tensor(turn_two) == audio
    torch.testing.assert_close(
        rows[first.turns.accept_layer][media], ref_rows[first.turns.accept_layer][media]
    )
    torch.testing.assert_close(rows[0][~media], ref_rows[0][~media])
    assert _freed(exported, companion=True)  # unread, handed back at the turn's end
    free_prefix(exported_two)


def _tiered_store(pages: Path, host_max_bytes: int) -> TieredPrefixStore:
    """The app's store as the session store replica runs it (loads whatever beats a 1 token/s
    prefill: the cost model is not what these stories are about)."""
    config = KVStoreConfig(
        host_max_bytes=host_max_bytes, disk_path=str(pages), prefill_tokens_per_s=1.0
    )
    return TieredPrefixStore(config, "tiny-qwen3-omni", make_channel("shared_memory"))


async def test_a_prefix_pushed_to_disk_survives_a_store_restart_and_loads_bit_exact(
    replicas, tmp_path
):
    """User story: a conversation pauses while other sessions push its KV out of memory and
    the store restarts; its next turn, on another replica, loads the prefix from disk and
    answers as a cold turn does."""
    first, second = replicas
    turn_one = [(i * 104729) % 250 + 10 for i in range(300)]  # neither replica has seen it
    turn_two = [*turn_one, 42, 43, 44]
    _, _, exported = await _turn(first, "disk-1", turn_one)
    store = _tiered_store(tmp_path, host_max_bytes=0)  # memory keeps nothing: all to disk
    await store.keep("s-1", exported, PromptContent(turn_one))
    assert _freed(exported)  # the store took the blocks; the Thinker's buffer is back
    store.disk.flush()
    restarted = _tiered_store(tmp_path, host_max_bytes=1 << 30)
    offered = await restarted.find("s-1", PromptContent(turn_two))
    assert restarted.stats()["disk"]["hits"] == 1
    loaded = _shared_memory_takes(await second.engine.channel_stats())
    tokens, cached, _ = await _turn(second, "disk-2", turn_two, offered)
    assert cached == len(turn_one) // BLOCK * BLOCK
    assert _shared_memory_takes(await second.engine.channel_stats()) == loaded + 1
    reference, _, _ = await _turn(first, "disk-2-reference", turn_two)
    assert tokens == reference


async def test_a_new_session_with_the_same_system_prompt_loads_the_first_sessions_blocks(
    replicas, tmp_path
):
    """User story: two callers of a voice agent share its long system prompt; the second
    caller's first turn starts from the KV the first caller's turn left, and answers as a
    cold turn does."""
    first, second = replicas
    system = [(i * 7) % 250 + 10 for i in range(256)]
    caller_a, caller_b = [*system, *range(60, 90)], [*system, *range(120, 140)]
    _, _, exported = await _turn(first, "agent-a", caller_a)
    store = _tiered_store(tmp_path, host_max_bytes=1 << 30)
    await store.keep("caller-a", exported, PromptContent(caller_a))
    offered = await store.find("caller-b", PromptContent(caller_b))
    assert offered is not None and store.stats()["host"]["hits"] == 1
    tokens, cached, _ = await _turn(second, "agent-b", caller_b, offered)
    assert cached == len(system)  # two whole blocks: up to where the callers differ
    reference, _, _ = await _turn(first, "agent-b-reference", caller_b)
    assert tokens == reference
    assert await store.find("caller-c", PromptContent([1, *caller_b])) is None
