"""Serve config YAMLs point at an importable builder and at a valid pipeline config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from omni_serve.config import load_pipeline_config

REPO = Path(__file__).parents[3]
SERVE_CONFIGS = sorted((REPO / "configs").glob("*.yaml")) + [
    REPO / "load_tests" / "configs" / "qwen_image_autoscale.yaml",
    REPO / "load_tests" / "configs" / "qwen3_omni_autoscale.yaml",
]


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_serve_config_is_consistent(path):
    config = yaml.safe_load(path.read_text())
    assert config["http_options"]["host"] == "127.0.0.1"  # loopback unless asked otherwise
    for app in config["applications"]:
        module, _, attr = app["import_path"].partition(":")
        assert (REPO / (module.replace(".", "/") + ".py")).exists()
        assert attr
        pipeline = REPO / app["args"]["pipeline_config"]
        assert load_pipeline_config(pipeline).name


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_serve_accepts_the_config_and_its_autoscaling_policy(path):
    from ray.serve.schema import ServeDeploySchema

    from omni_serve.scaling.pipeline_policy import PipelineAutoscalingPolicy

    schema = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    for app in schema.applications:
        if app.autoscaling_policy:
            module, _, name = app.autoscaling_policy["policy_function"].partition(":")
            assert module == "omni_serve.scaling.pipeline_policy"
            assert name == "PipelineAutoscalingPolicy"
            PipelineAutoscalingPolicy(**app.autoscaling_policy.get("policy_kwargs", {}))
