"""Loading pipeline configs from YAML with errors that name the field and the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from omni_serve.config.pipeline import PipelineConfig


class ConfigError(ValueError):
    """A pipeline config that cannot be used; the message lists ``field.path: reason`` lines."""


def parse_pipeline_config(data: dict[str, Any], source: str = "<config>") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc, source)) from None


def load_pipeline_config(path: str | Path) -> PipelineConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    # A Serve config YAML may carry the pipeline under an application's args.
    return parse_pipeline_config(data.get("pipeline", data), source=str(path))


def _format(exc: ValidationError, source: str) -> str:
    lines = [f"invalid pipeline config {source}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        reason = err["msg"].removeprefix("Value error, ")  # a validator's own message
        lines.append(f"  {where}: {reason}" if where else f"  {reason}")
    return "\n".join(lines)
