"""Step caching for diffusion transformers (cache-dit's DBCache), as one config switch.

DBCache runs the first ``compute_first_blocks`` (and last ``compute_last_blocks``) blocks every
step and, on a cached step, reuses the residual of the blocks in between from the last computed
step. Which steps are cached is either dynamic (the first blocks' residual changed by less than
``residual_diff_threshold``, within the warm-up and consecutive-step limits) or a fixed steps mask.
TaylorSeer extrapolates the cached residual instead of reusing it as is.

The DiT stage calls its transformer once per step for a whole batch (CFG rows included), so the
cache sees one forward per step (``enable_separate_cfg=False``) and a dynamic decision is taken
for the batch as a whole; a static mask keeps each image independent of its batch neighbours.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_serve.config.diffusion import StepCacheSettings


class StepCache:
    """cache-dit hooks on one transformer, refreshed for every denoising run."""

    def __init__(self, transformer: torch.nn.Module, settings: StepCacheSettings) -> None:
        import cache_dit

        blocks = len(transformer.transformer_blocks)
        if settings.compute_first_blocks + settings.compute_last_blocks > blocks:
            raise ValueError(
                f"step cache: compute_first_blocks + compute_last_blocks must be <= the "
                f"transformer's {blocks} blocks"
            )
        self.transformer = transformer
        self.settings = settings
        self._cache_dit = cache_dit
        cache_dit.enable_cache(transformer, cache_config=self._cache_config(None))

    def check_steps(self, steps: int) -> None:
        """ValueError when a request's step count does not fit the configured mask."""
        mask = self.settings.steps_mask
        if mask is not None and len(mask) != steps:
            raise ValueError(f"the DiT's steps_mask covers {len(mask)} steps, not {steps}")

    def begin(self, steps: int) -> None:
        """A fresh cache context for a run of ``steps`` steps (nothing carries over)."""
        self.check_steps(steps)
        calibrator = None
        if self.settings.taylorseer:
            calibrator = self._cache_dit.TaylorSeerCalibratorConfig(
                taylorseer_order=self.settings.taylorseer_order
            )
        self._cache_dit.refresh_context(
            self.transformer, cache_config=self._cache_config(steps), calibrator_config=calibrator
        )

    def cached_steps(self) -> int:
        """Steps the last run took from the cache."""
        stats = self._cache_dit.summary(self.transformer)
        return len(stats[-1].cached_steps) if stats else 0

    def _cache_config(self, steps: int | None) -> Any:  # cache-dit's DBCacheConfig
        s = self.settings
        mask = s.steps_mask
        if s.steps_mask_policy is not None and steps is not None:
            mask = self._cache_dit.steps_mask(total_steps=steps, mask_policy=s.steps_mask_policy)
        return self._cache_dit.DBCacheConfig(
            Fn_compute_blocks=s.compute_first_blocks,
            Bn_compute_blocks=s.compute_last_blocks,
            residual_diff_threshold=s.residual_diff_threshold,
            max_warmup_steps=s.max_warmup_steps,
            max_cached_steps=s.max_cached_steps,
            max_continuous_cached_steps=s.max_continuous_cached_steps,
            enable_separate_cfg=False,
            num_inference_steps=steps,
            steps_computation_mask=list(mask) if mask is not None else None,
            steps_computation_policy=s.masked_steps,
        )
