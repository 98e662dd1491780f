"""Qwen3-Omni: Ingress → (Encoder) → Thinker (→ Talker → Code2wav).

``serve run graphs.qwen3_omni:app`` serves the tiny model from the default pipeline config;
``build_app`` is the builder a Serve config YAML points at (``configs/qwen3_omni.yaml``), with
``args: {pipeline_config: <path>}``.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from graphs.pipeline_paths import REPO
from graphs.thinker_talker import build_thinker_talker_app

DEFAULT_PIPELINE = REPO / "configs" / "pipelines" / "qwen3_omni_tiny.yaml"


def build_app(args: dict[str, Any] | None = None) -> Application:
    return build_thinker_talker_app(args, DEFAULT_PIPELINE)


app = build_app()
