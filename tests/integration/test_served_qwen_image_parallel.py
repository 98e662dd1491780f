"""User story: `serve run configs/qwen_image_parallel.yaml` serves Qwen-Image with its DiT on
four workers (xfuser Ulysses 2 x CFG parallel 2, gloo); images equal diffusers' one-pass
pipeline, a cancelled request stops every worker, and a dead worker costs no request."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from omni_serve.testing.abuse import wait_for
from omni_serve.testing.serve_process import ServeProcess, actor_pids, replica_pids
from tests.integration.test_served_qwen_image import (
    diffusers_image,
    lighthouse,
    lighthouse_reference,
    png,
)

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"
WORKERS = 4
LONG = {
    "prompt": "a harbour",
    "size": "320x320",
    "num_inference_steps": 100,
    "seed": 1,
    "negative_prompt": "blurry",
    "n": 4,
}
SMALL = {"prompt": "a cat", "size": "64x64", "num_inference_steps": 2}
WHOLE_LOG = 10**8


@pytest.fixture(scope="module")
def served():
    with ServeProcess("configs/qwen_image_parallel.yaml", URL) as server:
        yield server


def generate(body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{URL}/v1/images/generations", json=body, timeout=timeout)


def test_the_dit_runs_on_four_workers(served):
    assert len(actor_pids("DenoiseWorker")) == WORKERS
    assert "DiT on 4 workers (ulysses 2 x cfg 2)" in served.tail(WHOLE_LOG)


@pytest.mark.parametrize("negative", [None, "blurry"])
def test_parallel_images_equal_diffusers(served, tiny_image_path, negative):
    r = generate(lighthouse(negative))
    assert r.status_code == 200, r.text
    reference = lighthouse_reference(tiny_image_path, negative)
    assert np.abs(png(r.json()["data"][0]["b64_json"]).astype(int) - reference).max() <= 1


def test_concurrent_requests_with_and_without_cfg_batch_and_stay_exact(served, tiny_image_path):
    bodies = [
        {
            "prompt": f"a boat, number {i}",
            "size": "64x64",
            "num_inference_steps": 3,
            "seed": i,
            **({"negative_prompt": "fog"} if i % 2 else {}),
        }
        for i in range(4)
    ]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(generate, bodies))
    for body, r in zip(bodies, answers, strict=True):
        assert r.status_code == 200, r.text
        reference = diffusers_image(
            tiny_image_path, body["prompt"], body.get("negative_prompt"), body["seed"], 64, 64, 3
        )
        assert np.abs(png(r.json()["data"][0]["b64_json"]).astype(int) - reference).max() <= 1


def test_a_request_past_its_deadline_stops_every_worker(served):
    start = time.monotonic()
    assert generate(LONG).status_code == 200
    whole = time.monotonic() - start
    assert whole > 4  # long enough that workers still busy with it would show below
    r = generate({**LONG, "timeout_s": 1})
    assert r.status_code == 504, r.text
    # The DiT runs one batch at a time on its workers: this one waits unless all four stopped.
    start = time.monotonic()
    small = generate(SMALL)
    assert small.status_code == 200, small.text
    assert time.monotonic() - start < whole / 2
    assert "DiT batch cancelled" in served.tail(WHOLE_LOG)


def test_a_worker_killed_mid_request_costs_no_request(served):
    """The group cannot go on without a rank: the replica exits, Serve replaces it with four
    new workers, and the request is sent again to the replacement."""
    workers, replica = actor_pids("DenoiseWorker"), replica_pids("dit")
    victim = sorted(workers)[1]
    threading.Timer(1.5, os.kill, (victim, signal.SIGKILL)).start()
    r = generate(LONG)
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == LONG["n"]
    assert replica_pids("dit").isdisjoint(replica)
    new = wait_for(
        lambda: (p := actor_pids("DenoiseWorker")) and len(p) == WORKERS and p,
        60,
        "four new DiT workers",
    )
    assert new.isdisjoint(workers)  # the old ones went with their replica: none left over
    assert generate(SMALL).status_code == 200
