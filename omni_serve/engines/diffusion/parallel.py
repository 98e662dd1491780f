"""One worker's membership in a parallel DiT group (xfuser on torch.distributed).

Model code asks this module, not xfuser, where the worker stands (its CFG branch, whether the
group stops) so that xfuser stays a lazy, optional import behind ``omni_serve.compat.xfuser``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from omni_serve.compat.xfuser import install_runtime_state, load_xfuser
from omni_serve.config import DiTParallelSettings


def distributed_backend(settings: DiTParallelSettings) -> str:
    if settings.backend != "auto":
        return settings.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def join_group(rank: int, settings: DiTParallelSettings, init_method: str, model_path: str) -> None:
    """Join the group (blocks until all ``world_size`` workers have called it)."""
    load_xfuser()
    from xfuser import xFuserArgs
    from xfuser.core.distributed import init_distributed_environment, initialize_model_parallel

    backend = distributed_backend(settings)
    init_distributed_environment(
        rank=rank,
        world_size=settings.world_size,
        distributed_init_method=init_method,
        # Ray gives each GPU worker its own device as cuda:0.
        local_rank=0,
        backend=backend,
    )
    initialize_model_parallel(
        classifier_free_guidance_degree=settings.cfg_degree,
        sequence_parallel_degree=settings.ulysses_degree,
        ulysses_degree=settings.ulysses_degree,
        backend=backend,
    )
    engine_config, _ = xFuserArgs(
        model=model_path,
        ulysses_degree=settings.ulysses_degree,
        use_cfg_parallel=settings.cfg_degree == 2,
    ).create_config()
    install_runtime_state(engine_config)


def cfg_branch() -> tuple[int, int]:
    """(this worker's CFG branch, number of branches run side by side)."""
    from xfuser.core.distributed import (
        get_classifier_free_guidance_rank,
        get_classifier_free_guidance_world_size,
    )

    return get_classifier_free_guidance_rank(), get_classifier_free_guidance_world_size()


def gather_cfg_branches(part: torch.Tensor) -> torch.Tensor:
    """Every branch's rows, in branch order, on every worker."""
    from xfuser.core.distributed import get_cfg_group

    return get_cfg_group().all_gather(part.contiguous(), dim=0)


def group_decides(local: bool) -> bool:
    """Rank 0's answer on every worker: all stop at the same step, or none does (a worker
    that stopped alone would leave the others waiting in a collective)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL moves GPU tensors only
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
