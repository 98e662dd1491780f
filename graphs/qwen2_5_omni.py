"""Qwen2.5-Omni: Ingress → Thinker (→ Talker → Token2Wav), on the same deployments as
Qwen3-Omni (the codec stage runs Token2Wav, a DiT and a vocoder, in chunks of DiT blocks).

``serve run graphs.qwen2_5_omni:app`` serves the tiny model from the default pipeline config;
``build_app`` is the builder a Serve config YAML points at (``configs/qwen2_5_omni.yaml``).
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from graphs.pipeline_paths import REPO
from graphs.thinker_talker import build_thinker_talker_app

DEFAULT_PIPELINE = REPO / "configs" / "pipelines" / "qwen2_5_omni_tiny.yaml"


def build_app(args: dict[str, Any] | None = None) -> Application:
    return build_thinker_talker_app(args, DEFAULT_PIPELINE)


app = build_app()
