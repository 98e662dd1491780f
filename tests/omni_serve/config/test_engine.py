"""Every engine field does what it says or is refused at load: what each shipped config's
stages actually hand their engines, and the settings a stage would silently ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_serve.config import ConfigError, load_pipeline_config, parse_pipeline_config
from omni_serve.engines.ar.vllm_engine import VLLMEngine
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.models.qwen3_omni.talker_static_runner import talker_runner

REPO = Path(__file__).parents[3]
CONFIGS = sorted(
    [
        *(REPO / "configs/pipelines").glob("*.yaml"),
        *(REPO / "load_tests/configs").glob("*_pipeline.yaml"),
        *(REPO / "tests/integration/pipelines").glob("*.yaml"),
    ]
)


@pytest.fixture(scope="module")
def talker_parts(tiny_omni_path):
    from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
    from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder

    talker, config = load_talker(tiny_omni_path)
    return talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path))


def stages(kind: str, family: str | None = None):
    for path in CONFIGS:
        config = load_pipeline_config(path)
        for stage in config.stages:
            if stage.kind == kind and family in (None, config.family):
                yield pytest.param(stage, id=f"{path.name}:{stage.name}")


@pytest.mark.parametrize("stage", list(stages("thinker")))
def test_a_thinkers_dtype_batch_size_and_graphs_reach_vllm(stage):
    engine = stage.engine
    received = VLLMEngine("model", engine.vllm_args()).engine_args
    assert received["dtype"] == engine.dtype
    assert received["max_num_seqs"] == engine.max_batch_size
    assert received["enforce_eager"] is not engine.cuda_graphs
    for key, value in engine.args.items():
        assert received[key] == value


def test_the_gpu_profile_loads_the_30b_thinker_in_bf16_with_graphs():
    config = load_pipeline_config(REPO / "configs/pipelines/qwen3_omni_30b_gpu.yaml")
    received = VLLMEngine("model", config.stage("thinker").engine.vllm_args()).engine_args
    assert (received["dtype"], received["enforce_eager"]) == ("bfloat16", False)
    talker = config.stage("talker").engine
    assert talker.cuda_graphs and talker.dtype == "bfloat16"


def test_the_gpu_profile_loads_the_7b_qwen2_5_thinker_in_bf16_with_graphs():
    config = load_pipeline_config(REPO / "configs/pipelines/qwen2_5_omni_7b_gpu.yaml")
    received = VLLMEngine("model", config.stage("thinker").engine.vllm_args()).engine_args
    assert (received["dtype"], received["enforce_eager"]) == ("bfloat16", False)
    talker = config.stage("talker").engine
    assert talker.cuda_graphs and talker.dtype == "bfloat16"


@pytest.mark.parametrize("stage", list(stages("talker", "qwen3_omni")))
def test_a_talkers_graph_switch_picks_its_runner(stage, talker_parts):
    talker, builder = talker_parts
    if stage.engine.cuda_graphs:  # the CUDA-graph runner: this machine has no GPU to capture on
        with pytest.raises(ValueError, match="needs CUDA"):
            talker_runner(talker, builder.tts_pad, stage.engine, 256)
        return
    runner = talker_runner(talker, builder.tts_pad, stage.engine, 256)
    assert type(runner) is TalkerRunner
    assert runner.max_batch_size == stage.engine.max_batch_size


def pipeline(kind: str, engine: dict | None, gpus: float = 0) -> dict:
    stage = {"name": "s", "kind": kind, "deployment": {"ray_actor_options": {"num_gpus": gpus}}}
    if engine is not None:
        stage["engine"] = engine
    return {"name": "m", "family": "qwen3_omni", "model": "tiny-qwen3-omni", "stages": [stage]}


@pytest.mark.parametrize(
    ("kind", "engine", "gpus", "reason"),
    [
        ("talker", {"kind": "vllm"}, 0, "engine.kind: a talker stage runs on torch, not vllm"),
        ("thinker", {"kind": "torch"}, 0, "engine.kind: a thinker stage runs on vllm, not torch"),
        ("ingress", {"kind": "torch"}, 0, "engine.kind: an ingress stage has no engine"),
        ("talker", None, 0, "a talker stage needs an engine (torch)"),
        (
            "thinker",
            {"kind": "vllm", "args": {"dtype": "bfloat16"}},
            0,
            "engine.args.dtype: set engine.dtype instead",
        ),
        (
            "thinker",
            {"kind": "vllm", "args": {"max_num_seqs": 4}},
            0,
            "engine.args.max_num_seqs: set engine.max_batch_size instead",
        ),
        (
            "thinker",
            {"kind": "vllm", "args": {"enforce_eager": False}},
            1,
            "engine.args.enforce_eager: set engine.cuda_graphs instead",
        ),
        (
            "talker",
            {"kind": "torch", "args": {"max_tokens": 9}},
            0,
            "engine.args.max_tokens: not an argument of a talker stage (it takes: "
            "max_model_len, max_new_tokens)",
        ),
        (
            "encoder",
            {"kind": "torch", "max_batch_size": 4},
            0,
            "engine.max_batch_size: an encoder stage does not batch",
        ),
        (
            "talker",
            {"kind": "torch", "cuda_graphs": True},
            0,
            "engine.cuda_graphs: needs a GPU (deployment.ray_actor_options.num_gpus > 0)",
        ),
        (
            "code2wav",
            {"kind": "torch", "cuda_graphs": True},
            1,
            "engine.cuda_graphs: a code2wav stage has no graphed step",
        ),
        (
            "talker",
            {"kind": "torch", "step_cache": {"enabled": True}},
            0,
            "engine.step_cache: for DiT stages only",
        ),
    ],
)
def test_a_setting_the_stage_would_ignore_is_refused_naming_stage_and_field(
    kind, engine, gpus, reason
):
    with pytest.raises(ConfigError) as err:
        parse_pipeline_config(pipeline(kind, engine, gpus))
    assert f"stage 's': {reason}" in str(err.value)


def test_graphs_on_a_gpu_talker_and_thinker_load():
    for kind, engine in (("talker", "torch"), ("thinker", "vllm")):
        config = parse_pipeline_config(pipeline(kind, {"kind": engine, "cuda_graphs": True}, 1))
        assert config.stage("s").engine.cuda_graphs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_config_as_the_deployments_receive_it_still_loads(path):
    """The graph hands each stage the validated config dumped to a dict, every default
    written out: a default must not read as a setting the stage refuses."""
    from omni_serve.config import PipelineConfig

    config = load_pipeline_config(path)
    assert PipelineConfig.model_validate(config.model_dump(mode="json")) == config
