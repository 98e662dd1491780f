"""How far chunked Token2Wav is from one-shot, by the context a chunk decodes with.

    .venv/bin/python load_tests/token2wav_chunk_bound.py [--preset tiny-qwen2-5-omni]

Qwen2.5-Omni's Token2Wav DiT attends within blocks (``block_size`` mel frames; some layers one
block back or ahead), but it runs an ODE: every solver step spreads each block's dependence one
block further, so a chunk decoded alone cannot equal the one-shot decode bit for bit. This
decodes 8 blocks of random codes once, then each inner block alone with ``left`` and ``right``
blocks of context and the same noise (the one-shot noise's slice), and prints the largest
difference of that block's mel from the one-shot mel: the bound a streaming Token2Wav holds.
"""

from __future__ import annotations

import argparse

import torch
import transformers.models.qwen2_5_omni.modeling_qwen2_5_omni as modeling
from transformers import Qwen2_5OmniForConditionalGeneration

from omni_serve.models import ensure_model

CONTEXTS = [(0, 0), (1, 0), (1, 1), (2, 1), (4, 1), (1, 2), (4, 2), (8, 2), (8, 4)]
BLOCKS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny-qwen2-5-omni")
    parser.add_argument("--steps", type=int, default=10, help="ODE steps (transformers' default)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(ensure_model(args.preset))
    dit, speaker = model.token2wav.code2wav_dit_model.eval(), model.speaker_map["Ethan"]
    per_block = dit.block_size // dit.repeats  # codes per block
    codes = torch.randint(
        0, 256, (1, BLOCKS * per_block), generator=torch.Generator().manual_seed(1)
    )
    frames = BLOCKS * dit.block_size
    noise = torch.randn(1, frames, dit.mel_dim, generator=torch.Generator().manual_seed(2))
    randn = modeling.torch.randn

    def decode(first_block: int, last_block: int) -> torch.Tensor:
        start, end = first_block * dit.block_size, last_block * dit.block_size
        modeling.torch.randn = lambda *_, **__: noise[:, start:end].clone()  # the same noise
        try:
            chunk = codes[:, first_block * per_block : last_block * per_block]
            cond, ref = speaker["cond"].float(), speaker["ref_mel"].float()
            return dit.sample(cond, ref, chunk, num_steps=args.steps)
        finally:
            modeling.torch.randn = randn

    one_shot = decode(0, BLOCKS)
    print(f"{args.preset}: {BLOCKS} blocks of {dit.block_size} mel frames, {args.steps} ODE steps")
    for left, right in CONTEXTS:
        worst = 0.0
        for block in range(1, BLOCKS - 1):
            first, last = max(0, block - left), min(BLOCKS, block + 1 + right)
            mine = decode(first, last)[..., (block - first) * dit.block_size :][
                ..., : dit.block_size
            ]
            theirs = one_shot[..., block * dit.block_size : (block + 1) * dit.block_size]
            worst = max(worst, float((mine - theirs).abs().max()))
        print(f"left {left} right {right} blocks: max |chunked - one-shot| mel = {worst:.3g}")


if __name__ == "__main__":
    main()
