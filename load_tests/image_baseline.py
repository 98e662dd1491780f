"""The image baseline: diffusers' own ``QwenImagePipeline``, one request after another, as a
plain script would serve it, given the same cores as the served graph (``baseline_shapes``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

import omni_serve  # noqa: F401  (torchvision compat)


def run_pipeline(
    model_dir: Path,
    prompts: list[str],
    requests: int,
    size: int,
    steps: int,
    threads: int = 1,
    ready: Callable[[], None] | None = None,
) -> dict:
    """``requests`` images in this process with ``threads`` torch threads."""
    from diffusers import QwenImagePipeline

    torch.set_num_threads(threads)
    pipe = QwenImagePipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    pipe("warm up", height=size, width=size, num_inference_steps=2)  # not counted
    if ready is not None:
        ready()
    start = time.perf_counter()
    records = []
    for i in range(requests):
        begin = time.perf_counter()
        pipe(
            prompts[i % len(prompts)],
            height=size,
            width=size,
            num_inference_steps=steps,
            generator=torch.Generator().manual_seed(i),
        )
        records.append({"ok": True, "e2e_s": time.perf_counter() - begin})
    return {"wall_s": time.perf_counter() - start, "records": records, "started": start}
