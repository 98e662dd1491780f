"""The engine args a VLLMEngine builds for the session KV connector: one worker only, and the
edge's channel settings passed through."""

from __future__ import annotations

import pytest

from omni_serve.engines.ar.vllm_engine import VLLMEngine, channel_kv_transfer_config


@pytest.mark.parametrize("key", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_the_kv_connector_refuses_more_than_one_worker(key):
    with pytest.raises(ValueError, match=f"needs {key}=1"):
        VLLMEngine("model", {key: 2}, kv_transfer_config=channel_kv_transfer_config())
    assert "kv_transfer_config" not in VLLMEngine("model", {key: 2}).engine_args


def test_the_kv_connector_args_name_the_edge_channel():
    engine = VLLMEngine("model", kv_transfer_config=channel_kv_transfer_config("direct", 1024))
    extra = engine.engine_args["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra == {"channel": "direct", "inline_max_bytes": 1024}
