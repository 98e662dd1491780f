"""The baseline: transformers' own ``generate`` (Qwen3-Omni's or Qwen2.5-Omni's), one request
after another, as a plain script would serve it, given the same cores as the served graph.

``run_baselines`` runs it in every same-core shape (``baseline_shapes``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from baseline_shapes import run_shapes  # noqa: E402

import omni_serve  # noqa: F401  (torchvision compat)
from omni_serve.compat.transformers import qwen3_omni_talker_audio_config

SAMPLE_RATE = 24_000


def run_baseline(
    model_dir: Path,
    prompts: list[str],
    requests: int,
    text_tokens: int,
    frames: int,
    family: str = "qwen3_omni",
    threads: int = 1,
    ready: Callable[[], None] | None = None,
) -> dict:
    """``requests`` replies in this process with ``threads`` torch threads; ``ready`` is called
    after the warm-up (a barrier, so that processes run at once)."""
    from transformers import AutoProcessor

    torch.set_num_threads(threads)
    model = load_model(family, model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)

    def one(i: int) -> dict:
        inputs = prompt_inputs(processor, prompts[i % len(prompts)])
        torch.manual_seed(i)
        start = time.perf_counter()
        wav = generate_speech(model, processor, inputs, text_tokens, frames)
        e2e = time.perf_counter() - start
        audio_s = wav.shape[-1] / SAMPLE_RATE
        # No audio leaves transformers' generate before it returns: TTFP == E2E.
        return {"ok": True, "ttfp_s": e2e, "e2e_s": e2e, "audio_s": audio_s, "error": ""}

    one(0)  # warm-up (the first call in a process is slow), not counted
    if ready is not None:
        ready()
    start = time.perf_counter()
    records = [one(i) for i in range(requests)]
    return {
        "concurrency": 1,
        "wall_s": time.perf_counter() - start,
        "records": records,
        "started": start,
    }


def prompt_inputs(processor, prompt: str):
    """The processor's inputs for one user turn."""
    messages = [{"role": "user", "content": prompt}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=text, return_tensors="pt")


def load_model(family: str, model_dir: Path):
    if family == "qwen2_5_omni":
        from transformers import Qwen2_5OmniForConditionalGeneration

        return Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir).eval()
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir).eval()
    qwen3_omni_talker_audio_config(model.talker, model.config.thinker_config)
    return model


@torch.no_grad()
def generate_speech(model, processor, inputs, text_tokens: int, frames: int) -> torch.Tensor:
    """transformers' ``generate`` of a spoken reply: greedy text, the Talker's own sampling."""
    im_end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    family = {}
    if type(model).__name__.startswith("Qwen2_5Omni"):  # its Talker stops on end or pad
        talker = model.config.talker_config
        ends = [talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id]
        family = {"talker_eos_token_id": ends}
    _, wav = model.generate(
        **inputs,
        thinker_max_new_tokens=text_tokens,
        thinker_do_sample=False,
        talker_max_new_tokens=frames,
        speaker="ethan" if not family else "Ethan",
        thinker_eos_token_id=im_end,
        **family,
    )
    return wav


def run_baselines(
    model_dir: Path,
    prompts: list[str],
    requests: int,
    text_tokens: int,
    frames: int,
    cores: list[int],
    family: str = "qwen3_omni",
) -> dict[str, dict]:
    """Each shape serves ``requests`` replies per process: ``{"1x1": ..., "1xN": ...,
    "Nx1": ...}`` (processes x threads)."""
    args = (model_dir, prompts, requests, text_tokens, frames, family)
    return run_shapes(run_baseline, cores, args)
