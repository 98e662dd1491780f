"""The torchvision fix holds in fresh processes, including those vLLM starts."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_torchvision_imports_after_omni_serve():
    out = run("import omni_serve, torchvision, torchvision.ops; print('ok')")
    assert out.returncode == 0, out.stderr[-2000:]


def test_vllm_plugin_is_registered_and_works_without_omni_serve_import():
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins();"
        "import torchvision; from vllm import ModelRegistry;"
        "assert 'Qwen3OmniMoeForConditionalGeneration' in ModelRegistry.get_supported_archs();"
        "print('ok')"
    )
    out = run(code)
    assert out.returncode == 0, out.stderr[-2000:]
