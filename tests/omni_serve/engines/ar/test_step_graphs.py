"""Shape buckets for graphed steps, and the modes a step runs in."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.ar.step_graphs import StepGraphs, batch_buckets, bucket, length_buckets


def test_batch_buckets_double_up_to_the_largest_batch():
    assert batch_buckets(1) == [1]
    assert batch_buckets(16) == [1, 2, 4, 8, 16]
    assert batch_buckets(24) == [1, 2, 4, 8, 16, 24]


def test_length_buckets_double_from_64_and_end_at_the_cache_length():
    assert length_buckets(64) == [64]
    assert length_buckets(1000) == [64, 128, 256, 512, 1000]


def test_a_size_takes_the_smallest_bucket_that_holds_it():
    assert [bucket(n, [1, 2, 4]) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="past the largest bucket"):
        bucket(5, [1, 2, 4])


def test_eager_and_compiled_runs_pass_the_static_ints_through():
    def step(x: torch.Tensor, width: int) -> torch.Tensor:
        return x[:, :width].sum(-1)

    x = torch.arange(12.0).view(3, 4)
    eager = StepGraphs(step, "eager").run((x,), (2,))
    compiled = StepGraphs(step, "compile", backend="aot_eager").run((x,), (2,))
    assert torch.equal(eager, torch.tensor([1.0, 9.0, 17.0])) and torch.equal(compiled, eager)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_cuda_graph_mode_without_cuda_is_refused():
    with pytest.raises(ValueError, match="needs CUDA"):
        StepGraphs(lambda x: x, "cuda_graph", safe_inputs=lambda inputs, static: inputs)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown graph mode"):
        StepGraphs(lambda x: x, "fast")
