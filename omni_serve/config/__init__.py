"""One pydantic schema for pipelines (stages, engines, edges, deployments, API) and its loader."""

from omni_serve.config.deployment import AutoscalingConfig, DeploymentSettings, RayActorOptions
from omni_serve.config.diffusion import DiTParallelSettings, StepCacheSettings
from omni_serve.config.loading import ConfigError, load_pipeline_config, parse_pipeline_config
from omni_serve.config.pipeline import (
    ApiSettings,
    ChannelSettings,
    EdgeConfig,
    EngineSettings,
    PipelineConfig,
    StageConfig,
)

__all__ = [
    "ApiSettings",
    "AutoscalingConfig",
    "ChannelSettings",
    "ConfigError",
    "DeploymentSettings",
    "DiTParallelSettings",
    "EdgeConfig",
    "EngineSettings",
    "PipelineConfig",
    "RayActorOptions",
    "StageConfig",
    "StepCacheSettings",
    "load_pipeline_config",
    "parse_pipeline_config",
]
