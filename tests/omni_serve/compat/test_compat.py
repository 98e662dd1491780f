"""The torchvision fix holds in fresh processes, including those vLLM starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_torchvision_imports_in_a_bare_process():
    """No omni_serve import: torch's backend autoload entry point applies the fix."""
    out = run("import torchvision, torchvision.ops; import transformers.image_utils")
    assert out.returncode == 0, out.stderr[-2000:]


def test_without_the_fix_torchvision_fails():
    """Guards the test above: with autoloading off and no omni_serve import, it breaks."""
    code = "import os; import torch; import torchvision"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert out.returncode != 0 and "torchvision::nms" in out.stderr


def test_vllm_plugin_is_registered_and_works_without_omni_serve_import():
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins();"
        "import torchvision; from vllm import ModelRegistry;"
        "assert 'Qwen3OmniMoeForConditionalGeneration' in ModelRegistry.get_supported_archs();"
        "print('ok')"
    )
    out = run(code)
    assert out.returncode == 0, out.stderr[-2000:]


def test_nixl_agents_read_gpu_memory_over_cuda_ipc_unless_the_operator_said_otherwise(
    monkeypatch,
):
    """UCX turns CUDA IPC reads off without NVLink, and GPU reads then crawl over TCP
    loopback (0.4 GB/s on an H100); an agent made before the CUDA context reads GPU memory
    through a slow emulated path. Where there is a GPU, a new agent turns CUDA IPC reads on
    (keeping an operator's value) and makes the CUDA context first; without one it sets
    nothing (UCX would warn about an unused variable on every agent)."""
    nixl = pytest.importorskip("omni_serve.compat.nixl")
    nixl.load_nixl()
    monkeypatch.delenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    nixl.new_agent("compat-test-cpu")
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in os.environ

    contexts = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: contexts.append(k.get("device")))
    nixl.new_agent("compat-test-a")
    assert os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "on" and contexts == ["cuda"]
    monkeypatch.setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "off")
    nixl.new_agent("compat-test-b")
    assert os.environ["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "off"
