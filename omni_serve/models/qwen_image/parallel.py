"""The Qwen-Image DiT on several workers: xfuser's Ulysses sequence parallel and CFG parallel.

xfuser's ``xFuserQwenImageTransformerWrapper`` splits the image and text sequences over the
Ulysses workers (zero-padding each to a multiple of their count) and runs attention with
``USP`` (all-to-all: sequence-split -> head-split and back). Its attention processor drops the
attention mask (xfuser 0.7.0), so a prompt padded in a batch, or padded to split evenly,
attends to its padding and the image drifts from a single worker's (max abs 0.005-0.12 on
tiny-qwen-image). ``MaskedUSPProcessor`` below is the same attention with a key mask laid out
in USP's gathered order, which makes the parallel output equal the single worker's.

CFG parallel is ours: the conditional rows of a batch run on one CFG branch, the
unconditional rows on the other, and the two predictions are gathered before the CFG combine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

from omni_serve.engines.diffusion.parallel import cfg_branch, gather_cfg_branches, group_decides
from omni_serve.models.qwen_image.denoise import Denoiser, ImageJob


@dataclass
class SequenceLayout:
    """What the transformer's forward knows and its attention layers need."""

    image_tokens: int = 0
    # The key mask of the current forward, built by its first block and reused by the others
    # (the wrapper hands every block the same attention_mask tensor).
    key_mask: torch.Tensor | None = None
    key_mask_of: torch.Tensor | None = None


def usp_key_mask(
    text_mask: torch.Tensor, image_tokens: int, local_text: int, local_image: int, workers: int
) -> torch.Tensor:
    """[B, 1, 1, S] bool mask of valid keys after USP's all-to-all.

    Each worker holds chunk r of the padded text and chunk r of the padded image and
    concatenates [text_r, image_r]; the all-to-all lays those out in worker order. A key is
    valid if it is a real text token the prompt mask keeps, or a real (unpadded) image token.
    """
    batch = text_mask.shape[0]
    text = torch.zeros(batch, workers * local_text, dtype=torch.bool, device=text_mask.device)
    text[:, : text_mask.shape[1]] = text_mask
    image = torch.arange(workers * local_image, device=text_mask.device) < image_tokens
    image = image.expand(batch, -1)
    joint = torch.cat(
        [text.view(batch, workers, local_text), image.reshape(batch, workers, local_image)], dim=2
    )
    return joint.reshape(batch, 1, 1, -1)


class MaskedUSPProcessor:
    """Joint text-image attention of a Qwen-Image block (as diffusers' processor computes it)
    through xfuser's USP, with padded and masked keys left out."""

    def __init__(self, layout: SequenceLayout) -> None:
        self.layout = layout

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from xfuser.core.distributed import get_sequence_parallel_world_size
        from xfuser.model_executor.layers.usp import USP

        if attention_mask is None:
            raise ValueError("the parallel DiT needs the prompt mask (ParallelDenoiser sends it)")
        local_text, local_image = encoder_hidden_states.shape[1], hidden_states.shape[1]
        layout = self.layout
        if layout.key_mask_of is not attention_mask:
            # The wrapper passes [prompt mask over the whole unsplit text, ones over local image].
            text_mask = attention_mask[:, : attention_mask.shape[1] - local_image]
            layout.key_mask = usp_key_mask(
                text_mask,
                layout.image_tokens,
                local_text,
                local_image,
                get_sequence_parallel_world_size(),
            )
            layout.key_mask_of = attention_mask
        key_mask = layout.key_mask
        head_dim = attn.inner_dim // attn.heads
        streams = []
        for x, q, k, v, norm_q, norm_k, freqs in (
            (
                encoder_hidden_states,
                attn.add_q_proj,
                attn.add_k_proj,
                attn.add_v_proj,
                attn.norm_added_q,
                attn.norm_added_k,
                1,
            ),
            (hidden_states, attn.to_q, attn.to_k, attn.to_v, attn.norm_q, attn.norm_k, 0),
        ):
            query, key, value = (proj(x).unflatten(-1, (-1, head_dim)) for proj in (q, k, v))
            query = norm_q(query) if norm_q is not None else query
            key = norm_k(key) if norm_k is not None else key
            if image_rotary_emb is not None:
                query = apply_rotary_emb_qwen(query, image_rotary_emb[freqs], use_real=False)
                key = apply_rotary_emb_qwen(key, image_rotary_emb[freqs], use_real=False)
            streams.append((query, key, value))
        query, key, value = (
            torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams, strict=True)
        )
        joint = USP(
            query, key, value, attn_layer=attn, attention_kwargs={"attn_mask": key_mask}
        ).transpose(1, 2)
        joint = joint.flatten(2, 3).to(query.dtype)
        text_out, image_out = joint[:, :local_text], joint[:, local_text:]
        image_out = attn.to_out[0](image_out.contiguous())
        if len(attn.to_out) > 1:
            image_out = attn.to_out[1](image_out)
        return image_out, attn.to_add_out(text_out.contiguous())


def load_sequence_parallel_transformer(path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """xfuser's Qwen-Image transformer with masked attention, from the checkpoint's
    ``transformer/`` folder (the same weights the single-worker DiT loads)."""
    from xfuser.model_executor.models.transformers.transformer_qwen import (
        xFuserQwenImageTransformerWrapper,
    )

    class MaskedSequenceParallelTransformer(xFuserQwenImageTransformerWrapper):
        def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.layout.image_tokens = hidden_states.shape[1]
            self.layout.key_mask_of = None  # a new forward: the first block builds the mask
            return super().forward(hidden_states, *args, **kwargs)

    model = MaskedSequenceParallelTransformer.from_pretrained(
        str(path), subfolder="transformer", torch_dtype=dtype
    )
    model.layout = SequenceLayout()
    for block in model.transformer_blocks:
        block.attn.set_processor(MaskedUSPProcessor(model.layout))
    return model


class ParallelDenoiser(Denoiser):
    """The same denoising loop on one worker of a group: every worker runs it in step."""

    def cancelled(self, jobs: list[ImageJob]) -> bool:
        return group_decides(super().cancelled(jobs))

    def predict(
        self,
        rows: torch.Tensor,
        timestep: torch.Tensor,
        embeds: torch.Tensor,
        mask: torch.Tensor | None,
        img_shapes: list,
        conditional: int,
    ) -> torch.Tensor:
        if mask is None:  # the masked processor needs the prompt mask even when all ones
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        branch, branches = cfg_branch()
        # CFG parallel when every row has its unconditional twin (rows = [cond, uncond]);
        # a batch with some requests without CFG runs whole on both branches.
        if branches == 1 or rows.shape[0] != 2 * conditional:
            return super().predict(rows, timestep, embeds, mask, img_shapes, conditional)
        mine = slice(branch * conditional, (branch + 1) * conditional)
        part = super().predict(
            rows[mine], timestep[mine], embeds[mine], mask[mine], img_shapes[mine], conditional
        )
        return gather_cfg_branches(part)


def load_parallel_denoiser(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> Denoiser:
    """Called on each worker after it joined the group (``join_group``)."""
    transformer = load_sequence_parallel_transformer(path, dtype).to(device)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(str(path), subfolder="scheduler")
    return ParallelDenoiser(transformer, dict(scheduler.config))
