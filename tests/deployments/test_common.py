"""Stage plumbing shared by the deployments."""

from __future__ import annotations

import subprocess
import sys

from deployments.common import edge_channel
from omni_serve.config import parse_pipeline_config

VLLM, TORCH, DIFFUSERS = {"kind": "vllm"}, {"kind": "torch"}, {"kind": "diffusers"}


def test_pin_to_cores_sets_affinity_and_threads():
    code = (
        "import os, torch; from deployments.common import pin_to_cores;"
        "pin_to_cores([0]); print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "[0] 1"


def test_edge_channel_follows_the_edge_settings():
    config = parse_pipeline_config(
        {
            "name": "m",
            "family": "qwen3_omni",
            "model": "tiny-qwen3-omni",
            "stages": [
                {"name": "a", "kind": "thinker", "engine": VLLM},
                {"name": "b", "kind": "talker", "engine": TORCH},
            ],
            "edges": [
                {"source": "a", "target": "b", "payload": "rows", "channel": {"backend": "inline"}}
            ],
        }
    )
    assert edge_channel(config, "a").name == "inline"
    assert edge_channel(config, "b").name == "auto"


def test_an_edge_is_told_apart_by_its_target_where_one_payload_goes_two_ways():
    """The ingress sends media both to the encoder stage and to the Thinker (prompts it
    encodes itself): each edge has its own settings."""
    config = parse_pipeline_config(
        {
            "name": "m",
            "family": "qwen3_omni",
            "model": "tiny-qwen3-omni",
            "stages": [
                {"name": "ingress", "kind": "ingress"},
                {"name": "enc", "kind": "encoder", "engine": TORCH},
                {"name": "th", "kind": "thinker", "engine": VLLM},
            ],
            "edges": [
                {
                    "source": "ingress",
                    "target": "enc",
                    "payload": "media",
                    "channel": {"backend": "shared_memory"},
                },
                {
                    "source": "ingress",
                    "target": "th",
                    "payload": "media",
                    "channel": {"backend": "object_store"},
                },
            ],
        }
    )
    assert edge_channel(config, "ingress", "media", target="enc").name == "shared_memory"
    assert edge_channel(config, "ingress", "media", target="th").name == "object_store"
    assert edge_channel(config, "ingress", "media", target="other").name == "auto"


def test_gpu_payloads_stay_on_the_gpu_only_toward_a_stage_that_reserves_one():
    """A reader without CUDA cannot read GPU memory (direct backend), so the producer's
    channel keeps a GPU payload there only when the edge's target has a GPU."""
    gpu = {"ray_actor_options": {"num_gpus": 1}}
    config = parse_pipeline_config(
        {
            "name": "m",
            "family": "qwen_image",
            "model": "tiny-qwen-image",
            "stages": [
                {"name": "dit", "kind": "dit", "deployment": gpu, "engine": DIFFUSERS},
                {"name": "vae", "kind": "vae", "deployment": gpu, "engine": DIFFUSERS},
                {"name": "text_encoder", "kind": "text_encoder", "engine": TORCH},
                {"name": "ingress", "kind": "ingress"},
            ],
            "edges": [
                {"source": "text_encoder", "target": "dit", "payload": "prompt_rows"},
                {
                    "source": "dit",
                    "target": "vae",
                    "payload": "latents",
                    "channel": {"backend": "direct"},
                },
                {"source": "vae", "target": "ingress", "payload": "images"},
            ],
        }
    )
    assert edge_channel(config, "text_encoder").gpu_consumer is True
    assert edge_channel(config, "dit").gpu_consumer is True  # pinned direct: GPU to GPU
    assert edge_channel(config, "vae").gpu_consumer is False  # the ingress has no GPU


def test_a_stage_runs_on_a_gpu_only_when_it_reserves_one_and_one_is_visible(monkeypatch):
    import torch

    from deployments.common import stage_device

    assert stage_device(0) == "cpu" and stage_device(1) == "cpu"  # no GPU on this machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert stage_device(0.25) == "cuda" and stage_device(0) == "cpu"


def test_every_stage_records_its_host_when_it_starts(monkeypatch):
    """Before a replica can be sent a ref, producers elsewhere must be able to see whether it
    can map their shared memory, also for a stage that makes no channel (the Talker)."""
    import deployments.common as common

    calls: list[str] = []
    monkeypatch.setattr(common, "announce", lambda: calls.append("announce"))
    monkeypatch.setattr(common, "resolve_model", lambda model: calls.append("model") or model)
    pipeline = {
        "name": "m",
        "family": "qwen3_omni",
        "model": "tiny-qwen3-omni",
        "stages": [{"name": "talker", "kind": "talker", "engine": TORCH}],
    }
    _, stage, _ = common.stage_setup(pipeline, "talker")
    assert stage.name == "talker" and calls == ["announce", "model"]


def test_a_stopped_replica_unlinks_its_shared_memory_and_a_hand_built_object_does_not(
    monkeypatch,
):
    """Serve ends a stopped replica without exit handlers: its pool goes in ``__del__``. An
    object built outside Serve (a test's) shares its process's pool: it leaves it alone."""
    import torch

    import deployments.common as common
    from omni_serve.transport import SharedMemoryChannel
    from omni_serve.transport import shared_memory as shm

    ref = SharedMemoryChannel().put(torch.ones(100_000))
    segment = shm.SHM_DIR / ref.key
    common.ReleasesSharedMemory().__del__()
    assert segment.exists()
    monkeypatch.setattr(common, "in_serve_replica", lambda: True)
    common.ReleasesSharedMemory().__del__()
    assert not segment.exists()


async def test_a_stage_workers_busy_time_is_the_time_its_work_ran():
    import time

    import pytest

    from deployments.common import StageWorker

    worker = StageWorker("busy-test")
    assert worker.busy_s == 0.0
    assert await worker.run(lambda s: time.sleep(s) or "done", 0.05) == "done"
    assert worker.busy_s >= 0.05
    with pytest.raises(ValueError):
        await worker.run(lambda: (time.sleep(0.02), int("x")))
    assert worker.busy_s >= 0.07  # a failed call counts too
