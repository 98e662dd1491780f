"""xfuser (xDiT) workarounds, all in one place. Imported only when a DiT runs in parallel.

xfuser 0.7.0 targets GPUs. On a machine without one (torch CPU build) it fails or silently
degrades in four places; each patch below names the symptom. With them its Ulysses sequence
parallel and CFG parallel run on gloo and match a single worker (CPU_STACK.md). On a GPU
machine nothing is patched: xfuser picks NCCL and yunchang by itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

import torch


def _needs_cpu_patches() -> bool:
    return not torch.cuda.is_available()


def load_xfuser() -> ModuleType:
    """Import xfuser (~5-15 s), patched for CPU when there is no GPU."""
    loaded = sys.modules.get("xfuser")
    if loaded is not None and hasattr(loaded, "xFuserArgs"):
        return loaded
    spec = importlib.util.find_spec("xfuser")
    if spec is None or spec.loader is None:
        raise ImportError(
            "a parallel DiT needs xfuser: pip install 'xfuser==0.7.0' 'yunchang==0.6.4' "
            "(or the project's [parallel] extra)"
        )
    package = importlib.util.module_from_spec(spec)
    sys.modules["xfuser"] = package
    try:
        # xfuser.envs is read by the package's own __init__, so it is patched in between:
        # the package module exists (for the submodule import) but has not run yet.
        envs = importlib.import_module("xfuser.envs")
        if _needs_cpu_patches():
            # xfuser 0.7.0: `import xfuser` raises NotImplementedError "No Accelerators
            # (AMD/NV/MTT GPU, AMD MI instinct accelerators) available" (envs.CUDA_VERSION).
            envs.get_device_version = lambda: None
            # xfuser 0.7.0: init_distributed_environment raises the same error choosing a
            # torch.distributed backend; gloo is the CPU one.
            envs.get_torch_distributed_backend = lambda: "gloo"
            # xfuser 0.7.0: yunchang is only looked for with CUDA; without it the sequence
            # parallel group gets no Ulysses process group and USP fails on `None.ULYSSES_PG`.
            envs.PACKAGES_CHECKER.packages_info["has_long_ctx_attn"] = True
        spec.loader.exec_module(package)
    except BaseException:
        sys.modules.pop("xfuser", None)
        raise
    if _needs_cpu_patches():
        import xfuser.model_executor.layers.usp as usp
        import yunchang.globals

        # xfuser 0.7.0: usp.py binds yunchang's PROCESS_GROUP only `if torch.cuda.is_available()`
        # (else None), so Ulysses all-to-all fails with AttributeError on CPU.
        usp.PROCESS_GROUP = yunchang.globals.PROCESS_GROUP
    return package


def install_runtime_state(engine_config: Any) -> None:
    """Give xfuser the runtime state its attention layers read (backend, degrees).

    xfuser 0.7.0 builds it from a whole xFuser pipeline (``DiTRuntimeState``) or, without one,
    from a default config whose degrees are all 1 (``ExternalRuntimeState``: "parallel_world_size
    1 must be equal to dit_parallel_size 2"). We run our own denoising loop, so the external
    state is built from our config instead.
    """
    from xfuser.core.distributed import runtime_state

    state = runtime_state.ExternalRuntimeState.__new__(runtime_state.ExternalRuntimeState)
    runtime_state.RuntimeState.__init__(state, engine_config)
    # SDPA on CPU and GPU alike: it takes the key mask that padded prompts need (xfuser would
    # pick flash attention on a GPU, which takes none).
    state.set_attention_backend("SDPA")
    runtime_state._RUNTIME = state
