"""Diffusion-stage settings: cache-dit step caching of the DiT."""

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
