"""What every stage deployment does the same way: read its slice of the pipeline config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_serve.config import PipelineConfig, StageConfig
from omni_serve.models import resolve_model


def stage_setup(
    pipeline: dict[str, Any], stage_name: str
) -> tuple[PipelineConfig, StageConfig, Path]:
    config = PipelineConfig.model_validate(pipeline)
    return config, config.stage(stage_name), resolve_model(config.model)


def stage_dtype(stage: StageConfig):
    """The torch dtype a stage's engine asks for (float32 on CPU by default)."""
    import torch

    return getattr(torch, stage.engine.dtype if stage.engine else "float32")
