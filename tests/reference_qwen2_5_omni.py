"""Reference runs of transformers' Qwen2.5-Omni used by golden tests: the whole ``generate``
(greedy Thinker and Talker, seeded Token2Wav) and what each stage saw on the way."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.reference import processor_inputs

THINKER_MAX_TOKENS = 12
TALKER_MAX_TOKENS = 60
SPEAKER = "Ethan"
NOISE_SEED = 7  # Token2Wav's ODE starts from noise


@dataclass
class ReferenceRun:
    kind: str  # tests/reference.py's prompt_messages kind
    inputs: dict
    prompt_ids: list[int]
    generated: list[int]  # Thinker tokens
    last_hidden: torch.Tensor  # [prompt + generated - 1, H]: the final norm's output
    codes: torch.Tensor  # [T]: the Talker's codes, its stop code excluded
    waveform: torch.Tensor  # [samples]


def talker_eos(model) -> list[int]:
    talker = model.config.talker_config
    return [talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id]


def _with_mask(_module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Hands the Talker's forward the 2D attention mask its generate() was given.

    The Talker's forward takes a 2D mask as its sign of a prefill: with one it adds the codec
    pad and bos embeddings to the prompt's last two rows and places the prompt with M-RoPE,
    and its decode steps continue from those positions. transformers 5.19's generate turns an
    all-ones mask into None before forward (the SDPA path needs none), so none of that
    happens: no codec rows, and 1D positions even for media. The mask restores what the
    model's code says; the served Talker does the same.
    """
    if kwargs.get("attention_mask") is None:
        cache = kwargs.get("past_key_values")
        past = cache.get_seq_length() if cache is not None else 0
        new = (
            kwargs.get("inputs_embeds")
            if kwargs.get("inputs_embeds") is not None
            else kwargs["input_ids"]
        ).shape[1]
        kwargs["attention_mask"] = torch.ones(1, past + new, dtype=torch.long)
    return args, kwargs


@torch.no_grad()
def reference_run(model, processor, kind: str) -> ReferenceRun:
    inputs = processor_inputs(processor, kind)
    hears = {"use_audio_in_video": True} if kind == "video_audio" else {}
    eos = model.config.thinker_config.text_config.eos_token_id
    talked: list[torch.Tensor] = []
    talker_generate = model.talker.generate

    def spy(*args, **kwargs):
        out = talker_generate(*args, **kwargs)
        talked.append(out[0, kwargs["input_ids"].shape[1] :].clone())
        return out

    # transformers 5.19 hands unprefixed inputs to the Talker too, whose generate() refuses
    # pixel_values; prefixed, they reach the Thinker only (and its image rows still get zeroed).
    routed = {("thinker_" + k if k.startswith("pixel_values") else k): v for k, v in inputs.items()}
    model.talker.generate = spy
    hook = model.talker.register_forward_pre_hook(_with_mask, with_kwargs=True)
    try:
        torch.manual_seed(NOISE_SEED)
        sequences, wav = model.generate(
            **routed,
            **hears,
            speaker=SPEAKER,
            thinker_max_new_tokens=THINKER_MAX_TOKENS,
            thinker_do_sample=False,
            thinker_eos_token_id=eos,
            talker_do_sample=False,
            talker_max_new_tokens=TALKER_MAX_TOKENS,
            talker_eos_token_id=talker_eos(model),
        )
    finally:
        model.talker.generate = talker_generate
        hook.remove()
    out = model.thinker.generate(
        **inputs,
        **hears,
        max_new_tokens=THINKER_MAX_TOKENS,
        do_sample=False,
        output_hidden_states=True,
        return_dict_in_generate=True,
        eos_token_id=eos,
    )
    n = inputs["input_ids"].shape[1]
    assert torch.equal(out.sequences, sequences)
    codes = talked[0]
    stops = torch.isin(codes, torch.tensor(talker_eos(model))).nonzero()
    if len(stops):
        codes = codes[: int(stops[0])]
    return ReferenceRun(
        kind=kind,
        inputs=inputs,
        prompt_ids=inputs["input_ids"][0].tolist(),
        generated=out.sequences[0, n:].tolist(),
        last_hidden=torch.cat([step[-1] for step in out.hidden_states], dim=1)[0],
        codes=codes,
        waveform=wav,
    )
