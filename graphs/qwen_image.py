"""Qwen-Image as a graph of Serve deployments: Ingress → TextEncoder → DiT → VAE.

``serve run graphs.qwen_image:app`` serves the tiny model from the default pipeline config;
``build_app`` is the builder a Serve config YAML points at (``configs/qwen_image.yaml``).
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.dit import DiTDeployment
from deployments.image_ingress import ImageIngress
from deployments.text_encoder import TextEncoderDeployment
from deployments.vae import VAEDeployment
from graphs.pipeline_paths import REPO, pipeline_path
from omni_serve.config import PipelineConfig, load_pipeline_config

DEFAULT_PIPELINE = REPO / "configs" / "pipelines" / "qwen_image_tiny.yaml"
STAGE_CLASSES = {"text_encoder": TextEncoderDeployment, "dit": DiTDeployment, "vae": VAEDeployment}


def build_app(args: dict[str, Any] | None = None) -> Application:
    args = args or {}
    config: PipelineConfig = load_pipeline_config(
        pipeline_path(args.get("pipeline_config", DEFAULT_PIPELINE))
    )
    if config.family != "qwen_image":
        raise ValueError(f"pipeline {config.name!r} is family {config.family!r}, not qwen_image")
    data = config.model_dump(mode="json")
    bound = {}
    for kind, cls in STAGE_CLASSES.items():
        stage = next((s for s in config.stages if s.kind == kind), None)
        if stage is None:
            raise ValueError(f"pipeline {config.name!r} has no {kind!r} stage")
        options = stage.serve_options()
        bound[kind] = cls.options(name=stage.name, **options).bind(data, stage.name)
    ingress = next(s for s in config.stages if s.kind == "ingress")
    return ImageIngress.options(name=ingress.name, **ingress.deployment.serve_options()).bind(
        data, bound["text_encoder"], bound["dit"], bound["vae"]
    )


app = build_app()
