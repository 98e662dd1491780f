"""Diffusion-stage settings: cache-dit step caching and parallel workers of the DiT."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StepCacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Turn step caching (cache-dit DBCache) on.")
    compute_first_blocks: int = Field(
        8, ge=1, description="Blocks computed every step whose residual decides caching (Fn)."
    )
    compute_last_blocks: int = Field(
        0, ge=0, description="Trailing blocks computed every step to correct a cached one (Bn)."
    )
    residual_diff_threshold: float = Field(
        0.08, ge=0, description="Cache a step when the relative residual change is below this."
    )
    max_warmup_steps: int = Field(8, ge=0, description="Leading steps that are never cached.")
    max_cached_steps: int = Field(-1, ge=-1, description="Most cached steps per image; -1 = any.")
    max_continuous_cached_steps: int = Field(
        -1, ge=-1, description="Most cached steps in a row; -1 = any."
    )
    taylorseer: bool = Field(
        False, description="Extrapolate cached residuals with TaylorSeer instead of reusing them."
    )
    taylorseer_order: int = Field(1, ge=1, le=4, description="TaylorSeer's expansion order.")
    steps_mask_policy: Literal["slow", "medium", "fast", "ultra"] | None = Field(
        None,
        description="A fixed compute/cache pattern from cache-dit's presets, scaled to the "
        "request's step count (slow computes the most steps).",
    )
    steps_mask: list[Literal[0, 1]] | None = Field(
        None,
        description="An explicit pattern, 1 = compute, 0 = cache; must be as long as the "
        "request's step count (a request with another count is rejected).",
    )
    masked_steps: Literal["static", "dynamic"] = Field(
        "static",
        description="Steps the mask marks 0: 'static' always reuses the cache, 'dynamic' "
        "only when the residual change is under the threshold.",
    )

    @model_validator(mode="after")
    def _one_mask(self) -> StepCacheSettings:
        if self.steps_mask is not None and self.steps_mask_policy is not None:
            raise ValueError("give steps_mask or steps_mask_policy, not both")
        return self


class DiTParallelSettings(BaseModel):
    """Several workers denoise one batch together (xfuser): Ulysses splits the image sequence
    (and the attention heads) over ``ulysses_degree`` workers, CFG parallel runs the
    conditional and unconditional passes on two. Workers = ulysses_degree x cfg_degree."""

    model_config = ConfigDict(extra="forbid")

    ulysses_degree: int = Field(
        1, ge=1, description="Workers sharing the sequence (must divide the attention heads)."
    )
    cfg_degree: Literal[1, 2] = Field(
        1, description="2: the CFG branches of a batch run on two workers at once."
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto = nccl with GPUs, else gloo."
    )
    worker_cpus: float = Field(
        0.5, ge=0, description="CPUs Ray reserves for each worker (the replica keeps its own)."
    )
    worker_gpus: float = Field(0, ge=0, description="GPUs Ray reserves for each worker.")
    cpu_cores: list[list[int]] | None = Field(
        None, description="CPU cores each worker's threads are pinned to, one list per worker."
    )

    @property
    def world_size(self) -> int:
        return self.ulysses_degree * self.cfg_degree

    @model_validator(mode="after")
    def _cores_per_worker(self) -> DiTParallelSettings:
        if self.cpu_cores is not None and len(self.cpu_cores) != self.world_size:
            raise ValueError(
                f"cpu_cores has {len(self.cpu_cores)} lists for {self.world_size} workers"
            )
        return self
