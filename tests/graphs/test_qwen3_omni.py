"""The Qwen3-Omni graph builder: which stages a pipeline config may leave out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve import Application

from graphs.qwen3_omni import build_app

REPO = Path(__file__).parents[2]


def pipeline_without(tmp_path: Path, *kinds: str) -> str:
    config = yaml.safe_load((REPO / "configs/pipelines/qwen3_omni_tiny.yaml").read_text())
    config["stages"] = [s for s in config["stages"] if s["kind"] not in kinds]
    names = {s["name"] for s in config["stages"]}
    config["edges"] = [e for e in config["edges"] if {e["source"], e["target"]} <= names]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def stage_names(app: Application) -> set[str]:
    """The deployments an application binds (the ingress and what it was bound with)."""
    found, todo = set(), [app]
    while todo:
        deployment = todo.pop()._bound_deployment
        found.add(deployment.name)
        todo += [arg for arg in deployment.init_args if isinstance(arg, Application)]
    return found


def test_the_text_only_config_binds_no_talker_or_code2wav():
    app = build_app({"pipeline_config": "configs/pipelines/qwen3_omni_text_tiny.yaml"})
    assert stage_names(app) == {"ingress", "encoder", "thinker", "sessions"}  # the KV store
    full = {"ingress", "encoder", "thinker", "talker", "code2wav", "sessions", "spoken_replies"}
    assert stage_names(build_app()) == full


def test_spoken_replies_are_kept_only_with_a_talker_and_a_ttl(tmp_path):
    config = yaml.safe_load((REPO / "configs/pipelines/qwen3_omni_tiny.yaml").read_text())
    config.setdefault("api", {})["spoken_reply_ttl_s"] = 0
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    assert "spoken_replies" not in stage_names(build_app({"pipeline_config": str(path)}))


@pytest.mark.parametrize("left_out", [("talker",), ("code2wav",)])
def test_a_talker_without_code2wav_or_the_other_way_round_is_refused(tmp_path, left_out):
    with pytest.raises(ValueError, match="talker and code2wav stages go together"):
        build_app({"pipeline_config": pipeline_without(tmp_path, *left_out)})


def test_a_pipeline_without_a_thinker_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has no 'thinker' stage"):
        build_app({"pipeline_config": pipeline_without(tmp_path, "thinker")})
