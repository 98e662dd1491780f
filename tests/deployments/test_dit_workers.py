"""A parallel DiT worker honours a cancel that reaches it before the batch's run does (the
replica sends both at once, and they race on the worker's two threads)."""

from __future__ import annotations

from collections import deque

import torch

from deployments.dit_workers import DenoiseWorker
from omni_serve.models.qwen_image.denoise import ImageJob


class SeesCancel:
    def run(self, jobs: list[ImageJob]) -> list[bool]:
        return [job.cancel.is_set() for job in jobs]


def worker() -> DenoiseWorker:
    w = DenoiseWorker.__new__(DenoiseWorker)  # without joining a process group
    w.rank, w.denoiser, w.jobs, w.cancelled = 0, SeesCancel(), {}, deque(maxlen=256)
    return w


def job() -> ImageJob:
    return ImageJob(torch.zeros(2, 4), 64, 64, 2, seed=0)


def test_a_cancel_before_the_run_still_stops_it():
    w = worker()
    w.cancel("early")
    assert w.run("early", [job(), job()]) == [True, True]
    assert w.run("other", [job()]) == [False]
    assert w.jobs == {}


def test_jobs_travel_to_workers_without_their_event():
    import pickle

    original = job()
    original.cancel.set()
    copy = pickle.loads(pickle.dumps(original))
    assert not copy.cancel.is_set() and torch.equal(copy.prompt_embeds, original.prompt_embeds)
