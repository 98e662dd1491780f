"""The pipeline schema: shipped configs load; bad ones fail with the field path and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from omni_serve.config import (
    ConfigError,
    DeploymentSettings,
    EngineSettings,
    PipelineConfig,
    load_pipeline_config,
    parse_pipeline_config,
)

CONFIGS = sorted((Path(__file__).parents[3] / "configs" / "pipelines").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_pipeline_configs_are_valid(path):
    config = load_pipeline_config(path)
    assert config.stages and config.served_model_name


def minimal(**overrides) -> dict:
    data = {
        "name": "m",
        "family": "qwen3_omni",
        "model": "tiny-qwen3-omni",
        "stages": [{"name": "thinker", "kind": "thinker", "engine": {"kind": "vllm"}}],
    }
    data.update(overrides)
    return data


def one_stage(name: str, stage_kind: str, /, **engine) -> dict:
    """A pipeline of one stage with the given engine fields (``kind=`` is the engine's), of
    the family that has such a stage."""
    family = "qwen_image" if stage_kind in ("text_encoder", "dit", "vae") else "qwen3_omni"
    stages = [{"name": name, "kind": stage_kind, "engine": engine}]
    return minimal(family=family, stages=stages)


def test_defaults_fill_in():
    config = parse_pipeline_config(minimal())
    stage = config.stage("thinker")
    assert stage.deployment.num_replicas == 1
    assert config.api.api_key is None and not config.api.allow_unauthenticated


@pytest.mark.parametrize(
    ("data", "where", "reason"),
    [
        (minimal(stages=[{"name": "t", "kind": "thinkr"}]), "stages.0.kind", "Input should be"),
        (
            minimal(stages=[{"name": "t", "kind": "thinker", "deployment": {"num_replicas": 0}}]),
            "stages.0.deployment.num_replicas",
            "greater than or equal to 1",
        ),
        (minimal(api={"max_tokens_limit": 0}), "api.max_tokens_limit", "greater than or equal"),
        (minimal(api={"port": 8000}), "api.port", "Extra inputs are not permitted"),
        (minimal(bogus=1), "bogus", "Extra inputs are not permitted"),
        (
            minimal(api={"allowed_media_domains": ["images.example.com"]}),
            "api",
            "allowed_media_domains is set but allow_remote_urls is false",
        ),
        (
            minimal(api={"allow_private_media_addresses": True}),
            "api",
            "allow_private_media_addresses is set but allow_remote_urls is false",
        ),
        (
            minimal(
                family="qwen2_5_omni",
                stages=[{"name": "t2i", "kind": "text_encoder", "engine": {"kind": "torch"}}],
            ),
            "",  # the whole config
            "stage 't2i': family 'qwen2_5_omni' has no text_encoder stage (its stages: code2wav,",
        ),
        (
            one_stage("d", "dit", kind="diffusers") | {"family": "qwen3_omni"},
            "",  # the whole config
            "stage 'd': family 'qwen3_omni' has no dit stage",
        ),
        (
            minimal(edges=[{"source": "thinker", "target": "talker", "payload": "x"}]),
            "",  # the whole config
            "edges[0].target: unknown stage 'talker'",
        ),
        (
            one_stage("t", "thinker", kind="vllm", parallel={"ulysses_degree": 2}),
            "",  # the whole config
            "stage 't': engine.parallel: for DiT stages only",
        ),
        (
            one_stage(
                "d",
                "dit",
                kind="diffusers",
                parallel={"cfg_degree": 2},
                step_cache={"enabled": True},
            ),
            "stages.0.engine",
            "step_cache and parallel cannot be combined",
        ),
        (
            one_stage("d", "dit", kind="diffusers", parallel={"cfg_degree": 3}),
            "stages.0.engine.parallel.cfg_degree",
            "Input should be 1 or 2",
        ),
        (
            one_stage(
                "d", "dit", kind="diffusers", parallel={"ulysses_degree": 2, "cpu_cores": [[0]]}
            ),
            "stages.0.engine.parallel",
            "cpu_cores has 1 lists for 2 workers",
        ),
        (
            one_stage("d", "dit", kind="diffusers", batching="step", step_cache={"enabled": True}),
            "stages.0.engine",
            "batching 'step' cannot be combined with step_cache or parallel",
        ),
        (
            one_stage("v", "vae", kind="diffusers", batching="step"),
            "",  # the whole config
            "stage 'v': engine.batching: for DiT stages only",
        ),
    ],
)
def test_bad_configs_name_the_field_and_reason(data, where, reason):
    with pytest.raises(ConfigError) as err:
        parse_pipeline_config(data)
    message = str(err.value)
    assert "Value error" not in message and "<root>" not in message
    if where:
        assert f"{where}:" in message and reason in message
    else:  # an error about the whole config is its reason alone
        assert f"\n  {reason}" in message


@pytest.mark.parametrize(
    ("engine", "per_step"),
    [
        ({}, True),
        ({"batching": "request"}, False),
        ({"step_cache": {"enabled": True}}, False),
        ({"step_cache": {"enabled": False}}, True),
        ({"parallel": {"ulysses_degree": 2}}, False),
        ({"parallel": {"ulysses_degree": 1}}, True),
    ],
)
def test_dit_batching_auto_is_per_step_unless_cache_or_parallel_need_whole_batches(
    engine, per_step
):
    assert EngineSettings(kind="diffusers", **engine).step_batching is per_step


def test_replicas_and_autoscaling_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        DeploymentSettings(num_replicas=2, autoscaling_config={"max_replicas": 3})
    auto = DeploymentSettings(autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    opts = auto.serve_options()
    assert "num_replicas" not in opts and opts["autoscaling_config"]["max_replicas"] == 3
    with pytest.raises(ValueError, match="min_replicas"):
        DeploymentSettings(autoscaling_config={"min_replicas": 4, "max_replicas": 3})


def test_serve_accepts_the_deployment_options_with_backpressure():
    from ray import serve

    settings = DeploymentSettings(max_queued_requests=4, retry_after_s=2.5)
    opts = settings.serve_options()
    assert opts["backpressure_config"] == {"status_code": 503, "retry_after_s": 2.5}

    @serve.deployment
    class Stage:
        pass

    config = Stage.options(**opts)._deployment_config
    assert config.max_queued_requests == 4 and config.backpressure_config.retry_after_s == 2.5


def test_a_parallel_dit_reserves_its_workers_on_one_node():
    from ray import serve

    config = parse_pipeline_config(
        minimal(
            family="qwen_image",
            stages=[
                {
                    "name": "dit",
                    "kind": "dit",
                    "engine": {
                        "kind": "diffusers",
                        "parallel": {
                            "ulysses_degree": 2,
                            "cfg_degree": 2,
                            "worker_cpus": 0.25,
                            "worker_gpus": 1,
                        },
                    },
                    "deployment": {"ray_actor_options": {"num_cpus": 0.1}},
                }
            ],
        )
    )
    opts = config.stage("dit").serve_options()
    assert opts["placement_group_strategy"] == "STRICT_PACK"
    worker = {"CPU": 0.25, "GPU": 1}
    assert opts["placement_group_bundles"] == [{"CPU": 0.1, "GPU": 0}] + [worker] * 4

    @serve.deployment
    class Stage:
        pass

    replica = Stage.options(**opts)._replica_config
    assert replica.placement_group_bundles == opts["placement_group_bundles"]
    single = parse_pipeline_config(one_stage("dit", "dit", kind="diffusers"))
    assert "placement_group_bundles" not in single.stage("dit").serve_options()


def test_yaml_errors_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline_config(bad)
    with pytest.raises(ConfigError, match="no such file"):
        load_pipeline_config(tmp_path / "missing.yaml")
    nested = tmp_path / "serve.yaml"
    nested.write_text(yaml.safe_dump({"pipeline": minimal()}))
    assert load_pipeline_config(nested).name == "m"


def test_every_field_has_a_description():
    def walk(model):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            annotation = field.annotation
            for candidate in getattr(annotation, "__args__", (annotation,)):
                if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                    walk(candidate)
                for inner in getattr(candidate, "__args__", ()):
                    if isinstance(inner, type) and hasattr(inner, "model_fields"):
                        walk(inner)

    walk(PipelineConfig)
