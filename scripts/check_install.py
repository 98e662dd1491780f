"""Fail loudly if setup pulled CUDA wheels or left a broken import behind.

A CUDA torch build (several GB of nvidia-* wheels) is what any unpinned dependency range pulls
on this machine; catching it here is cheaper than finding it in a failed test run.
"""

from __future__ import annotations

import importlib.metadata
import sys


def main() -> int:
    problems: list[str] = []
    cuda_dists = sorted(
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if d.metadata["Name"] and d.metadata["Name"].lower().startswith(("nvidia-", "cuda-"))
    )
    if cuda_dists:
        problems.append(f"CUDA wheels installed: {', '.join(cuda_dists)}")
    import torch

    if torch.version.cuda is not None or not torch.__version__.endswith("+cpu"):
        problems.append(
            f"torch is not the CPU build: {torch.__version__} (cuda {torch.version.cuda})"
        )
    from omni_serve.compat import torchvision as tv_compat

    tv_compat.install()
    modules = ["torchvision", "vllm", "ray.serve", "diffusers", "cache_dit", "soundfile"]
    for module in [*modules, "nixl_cu12"]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # report every broken import, not only the first
            problems.append(f"import {module} failed: {exc!r}")
    if problems:
        print("setup check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"setup check ok: torch {torch.__version__}, no CUDA wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
