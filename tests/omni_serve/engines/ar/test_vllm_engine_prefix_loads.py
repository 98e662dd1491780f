"""A request whose offered KV prefix cannot be loaded runs again without it, so its chunks,
cached-token count and captured rows are those of one forward (vLLM 0.32 on "recompute"
counted the failed tokens as cached and captured the failed forward's rows too)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from omni_serve.engines.ar.base import ARRequest
from omni_serve.engines.ar.vllm_engine import VLLMEngine, channel_kv_transfer_config
from omni_serve.transport.kv_blocks import EXPORT_KEY, PREFIX_KEY


class FakeAsyncLLM:
    """vLLM's AsyncLLM as the engine drives it: requests in ``failing`` end at once with an
    "error" finish and no tokens, as vLLM ends a request whose KV load failed on "fail"."""

    errored = False

    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.runs: list[tuple[str, dict | None]] = []

    async def generate(self, prompt, params, request_id):
        self.runs.append((request_id, (params.extra_args or {}).get("kv_transfer_params")))
        if request_id in self.failing:
            yield _output([], "error", finished=True)
            return
        yield _output([5], None, finished=False)
        yield _output([6], "stop", finished=True)

    async def abort(self, request_id):
        return None


def _output(tokens: list[int], reason: str | None, finished: bool) -> NS:
    completion = NS(token_ids=tokens, text="", finish_reason=reason, stop_reason=None)
    return NS(
        outputs=[completion],
        finished=finished,
        num_cached_tokens=0,
        kv_transfer_params=None,
        prompt_token_ids=[1, 2, 3],
    )


def _engine(failing: set[str]) -> tuple[VLLMEngine, FakeAsyncLLM]:
    engine = VLLMEngine("model", kv_transfer_config=channel_kv_transfer_config())
    engine._llm = FakeAsyncLLM(failing)
    return engine, engine._llm


def test_loads_that_fail_end_the_request_rather_than_recompute_it():
    engine, _ = _engine(set())
    assert engine.engine_args["kv_transfer_config"]["kv_load_failure_policy"] == "fail"


async def test_a_request_whose_prefix_fails_to_load_runs_again_without_it():
    engine, llm = _engine({"r1"})
    params = {PREFIX_KEY: "encoded-prefix", EXPORT_KEY: True}
    request = ARRequest("r1", prompt_token_ids=[1, 2, 3], kv_transfer_params=params)
    chunks = [chunk async for chunk in engine.generate(request)]
    assert [c.token_ids for c in chunks] == [[5], [6]]  # the rerun's, no error chunk
    assert [c.finish_reason for c in chunks] == [None, "stop"]
    assert llm.runs == [("r1", params), ("r1-unloaded", {EXPORT_KEY: True})]  # still exports


async def test_an_error_without_a_prefix_offered_is_the_callers_to_see():
    engine, llm = _engine({"r2"})
    request = ARRequest("r2", prompt_token_ids=[1, 2, 3], kv_transfer_params={EXPORT_KEY: True})
    chunks = [chunk async for chunk in engine.generate(request)]
    assert [c.finish_reason for c in chunks] == ["error"] and len(llm.runs) == 1
