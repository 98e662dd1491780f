"""Serve config YAMLs point at an importable builder and at a valid pipeline config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from omni_serve.config import load_pipeline_config

REPO = Path(__file__).parents[3]
SERVE_CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


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
