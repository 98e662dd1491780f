"""A config's cpu_cores written for a bigger node still serves on a smaller one, pinned to the
cores that are there, and the replica's log says which were not."""

from __future__ import annotations

import logging
import os

from omni_serve.engines.ar.vllm_engine import pin_cpu_cores
from omni_serve.engines.cpu_cores import usable_cores

HERE = sorted(os.sched_getaffinity(0))
NOT_HERE = max(HERE) + 1000


def test_cores_that_are_here_are_kept_and_the_rest_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert usable_cores([HERE[0], NOT_HERE]) == [HERE[0]]
    assert f"[{NOT_HERE}] not among this node's cores" in caplog.text
    assert f"pinned to [{HERE[0]}]" in caplog.text


def test_no_config_and_all_here_say_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert usable_cores(None) == [] and usable_cores([]) == []
        assert usable_cores(HERE) == HERE
    assert caplog.text == ""


def test_vllm_is_not_bound_to_a_core_that_is_not_here(monkeypatch, caplog):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        pin_cpu_cores([NOT_HERE])
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # vLLM binds by itself
    assert "not pinned" in caplog.text
    pin_cpu_cores([HERE[0], NOT_HERE])
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == str(HERE[0])
