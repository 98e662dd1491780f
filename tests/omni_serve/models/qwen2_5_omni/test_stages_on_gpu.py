"""The Qwen2.5-Omni Talker on a GPU: its static-shape step replayed as CUDA graphs makes the
codes the same step makes eagerly there, greedy and seeded, and in fp32 greedy transformers'
codes (test_talker_step.py holds the step to them on the CPU). Needs a CUDA GPU: skipped
elsewhere (CI has none; scripts/gpu_check.sh runs it on a lent one)."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.step_graphs import batch_buckets, length_buckets
from omni_serve.models.qwen2_5_omni.checkpoint import load_talker
from omni_serve.models.qwen2_5_omni.talker_static_runner import StaticTalkerRunner
from tests.omni_serve.models.qwen2_5_omni.conftest import KINDS
from tests.omni_serve.models.qwen2_5_omni.test_talker_step import SEEDED, all_codes, requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_float32"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
async def test_the_static_talker_step_as_cuda_graphs_gives_the_eager_steps_codes(
    tiny_model, builder, reference_runs, tiny_qwen2_5_omni_path, dtype
):
    talker, _ = load_talker(tiny_qwen2_5_omni_path, dtype=dtype, device="cuda")
    for sampling in (None, SEEDED):

        def runner(mode: str) -> StaticTalkerRunner:
            return StaticTalkerRunner(talker, builder.pad_row, 4, 1024, graph_mode=mode)

        eager = await all_codes(
            runner("eager"), requests(tiny_model, builder, reference_runs, sampling)
        )
        graphed_runner = runner("cuda_graph")
        captured = graphed_runner.capture()  # every bucket, on scratch rows, largest first
        assert captured == len(batch_buckets(4)) * len(length_buckets(1024))
        graphed = await all_codes(
            graphed_runner, requests(tiny_model, builder, reference_runs, sampling)
        )
        assert [c.tolist() for c in graphed] == [c.tolist() for c in eager]
        assert graphed_runner.graphs.captured == captured  # none mid-reply
        if sampling is None and dtype == torch.float32:
            for kind, codes in zip(KINDS, graphed, strict=False):
                assert torch.equal(codes, reference_runs[kind].codes), kind
