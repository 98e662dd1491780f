"""How long encoding whole replies stalls an ingress's event loop: inline (on the loop, as the
ingresses did before) against a worker thread (``asyncio.to_thread``, as they do now), in the
same run.

    .venv/bin/python load_tests/bench_encode_stall.py     # ~15 s

A non-streamed spoken reply is encoded whole (mp3 and opus cost 5-12 ms of CPU per second of
audio) and a generated image as PNG, JPEG or WebP. On the loop, every stream the replica is
writing waits meanwhile. ``--replies`` replies are encoded at once per burst: 60 s of audio
each, or 1024x1024 images of noise (what random weights draw; the hardest case for PNG).
Writes ``load_tests/results/bench_encode_stall.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import numpy as np

from omni_serve.api.images import images_b64
from omni_serve.media.audio_codec import encode_audio
from omni_serve.testing.loop_stall import burst, median

RESULTS = Path(__file__).parent / "results"
SAMPLE_RATE = 24000


def workloads(replies: int) -> dict[str, tuple]:
    rng = np.random.default_rng(0)
    audio = [(rng.standard_normal(SAMPLE_RATE * 60) * 0.1).astype(np.float32)] * replies
    images = [[rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8)] for _ in range(replies)]
    return {
        "opus_60s": (lambda samples: encode_audio(samples, SAMPLE_RATE, "opus"), audio),
        "mp3_60s": (lambda samples: encode_audio(samples, SAMPLE_RATE, "mp3"), audio),
        "png_1024": (images_b64, images),
    }


async def main(replies: int, rounds: int) -> dict:
    summary: dict = {"replies": replies, "rounds": rounds, "workloads": {}}
    for name, (encode, items) in workloads(replies).items():

        async def inline(item, encode=encode):
            return encode(item)

        async def threaded(item, encode=encode):
            return await asyncio.to_thread(encode, item)

        runs: dict[str, list[dict]] = {"inline": [], "thread": []}
        for _ in range(rounds):  # interleaved, so both see the same machine
            runs["inline"].append(await burst(inline, items))
            runs["thread"].append(await burst(threaded, items))
        stall = {mode: median(runs[mode], "max_stall_ms") for mode in runs}
        summary["workloads"][name] = {
            "runs": runs,
            "max_stall_ms": stall,
            "wall_s": {mode: median(runs[mode], "wall_s") for mode in runs},
            "max_stall_ratio_thread_over_inline": round(stall["thread"] / stall["inline"], 4),
        }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_encode_stall.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=2, help="replies encoded at once")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per mode, interleaved")
    args = parser.parse_args()
    result = asyncio.run(main(args.replies, args.rounds))
    for name, numbers in result["workloads"].items():
        print(
            name,
            {k: numbers[k] for k in ("max_stall_ms", "wall_s")},
            "ratio",
            numbers["max_stall_ratio_thread_over_inline"],
        )
