"""How long building prompts stalls an ingress's event loop: inline (``prepare_prompt`` on the
loop, as the ingress did before its ``PromptWorker``) against the worker, in the same run.

    .venv/bin/python load_tests/bench_prompt_stall.py     # ~30 s

Every stream an ingress serves (SSE tokens, audio deltas, WebSocket frames) is written from its
one event loop, so each millisecond the loop spends building a prompt is a millisecond every
stream waits. A ticker task asks to wake every 1 ms while a burst of chat requests is prepared
(``--requests`` at once, each a 1080p PNG and a 30 s clip); its lateness is the stall
a stream would see. Writes ``load_tests/results/bench_prompt_stall.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import numpy as np
from PIL import Image

from omni_serve.config import ApiSettings
from omni_serve.media.chat_parts import ChatMessage
from omni_serve.models.qwen3_omni.family import FAMILY
from omni_serve.models.registry import resolve_model
from omni_serve.models.thinker_talker.prompt_worker import PromptWorker
from omni_serve.models.thinker_talker.request import prepare_prompt
from omni_serve.testing.loop_stall import burst, median
from omni_serve.testing.media import png_data_url, wav_b64

RESULTS = Path(__file__).parent / "results"


def media_chat(seed: int) -> list[ChatMessage]:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 255, (1080, 1920, 3), np.uint8))
    clip = (rng.standard_normal(16000 * 30) * 0.1).astype(np.float32)
    return [
        ChatMessage.model_validate(
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": png_data_url(image)}},
                    {"type": "input_audio", "input_audio": {"data": wav_b64(clip, 16000)}},
                    {"type": "text", "text": "Describe both."},
                ],
            }
        )
    ]


async def main(requests: int, rounds: int) -> dict:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(resolve_model("tiny-qwen3-omni"))
    api = ApiSettings()
    chats = [media_chat(i) for i in range(requests)]
    worker = PromptWorker(processor, api, FAMILY)

    async def inline(chat):
        return prepare_prompt(processor, chat, api, family=FAMILY)

    await worker.chat(chats[0])  # warm both paths once
    prepare_prompt(processor, chats[0], api, family=FAMILY)
    runs: dict[str, list[dict]] = {"inline": [], "worker": []}
    for _ in range(rounds):  # interleaved, so both see the same machine
        runs["inline"].append(await burst(inline, chats))
        runs["worker"].append(await burst(worker.chat, chats))
    worker.close()

    summary = {
        "requests": requests,
        "rounds": rounds,
        "runs": runs,
        "max_stall_ms": {m: median(runs[m], "max_stall_ms") for m in runs},
        "wall_s": {m: median(runs[m], "wall_s") for m in runs},
        "max_stall_ratio_worker_over_inline": round(
            median(runs["worker"], "max_stall_ms") / median(runs["inline"], "max_stall_ms"), 3
        ),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_prompt_stall.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8, help="chats prepared at once")
    parser.add_argument("--rounds", type=int, default=5, help="bursts per mode, interleaved")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.requests, args.rounds)), indent=1))
