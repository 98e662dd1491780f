"""The baseline: transformers' own Qwen3-Omni ``generate``, one request after another, as a
plain script would serve it (one torch thread: more threads were measured slower here)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

import omni_serve  # noqa: F401  (torchvision compat)
from omni_serve.compat.transformers import qwen3_omni_talker_audio_config

SAMPLE_RATE = 24_000


def run_baseline(model_dir: Path, prompts: list[str], requests: int, text_tokens: int,
                 frames: int) -> dict:  # fmt: skip
    from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    torch.set_num_threads(1)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).eval()
    qwen3_omni_talker_audio_config(model.talker, model.config.thinker_config)
    processor = AutoProcessor.from_pretrained(model_dir)

    def one(i: int) -> dict:
        messages = [{"role": "user", "content": prompts[i % len(prompts)]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=text, return_tensors="pt")
        torch.manual_seed(i)
        start = time.perf_counter()
        with torch.no_grad():
            _, wav = model.generate(
                **inputs, thinker_max_new_tokens=text_tokens, thinker_do_sample=False,
                talker_max_new_tokens=frames, speaker="ethan",
                thinker_eos_token_id=model.config.im_end_token_id,
            )  # fmt: skip
        e2e = time.perf_counter() - start
        audio_s = wav.shape[-1] / SAMPLE_RATE
        # No audio leaves transformers' generate before it returns: TTFP == E2E.
        return {"ok": True, "ttfp_s": e2e, "e2e_s": e2e, "audio_s": audio_s, "error": ""}

    one(0)  # warm-up (the first call in a process is slow), not counted
    start = time.perf_counter()
    records = [one(i) for i in range(requests)]
    return {"concurrency": 1, "wall_s": time.perf_counter() - start, "records": records}
