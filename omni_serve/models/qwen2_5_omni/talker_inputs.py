"""Thinker → Talker glue for Qwen2.5-Omni: the Talker's prompt and its per-step text rows.

Mirrors ``Qwen2_5OmniForConditionalGeneration.generate`` (transformers 5.19) in streaming
form. Unlike Qwen3-Omni's, this Talker reads the Thinker's LAST hidden layer (the final
norm's output) at every position, plus the token embeddings (zeroed at media positions), in
the Thinker's width; its own ``thinker_to_talker_proj`` projects each step's input.

- Prompt: one row per prompt position (last hidden + embedding), then the voice's first text
  token (its embedding plus the codec pad's), then the reply's first token (its last hidden +
  embedding, plus the codec bos's). So the prompt needs the hidden row of the first reply
  token, which the Thinker computes in the step that makes the second one.
- Each later reply token k gives one trailing row (its last hidden + embedding); the reply's
  last token is replaced by ``tts_text_eod``'s embedding, and after it the Talker reads
  ``tts_pad``'s embedding for as long as it speaks.

Rows are kept in the Thinker's dtype on the CPU (they come from the channel) and moved where
the Talker's weights are by the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni_serve.engines.ar.torch_engine import PENALTY_HISTORY
from omni_serve.models.thinker_talker.messages import SpeakRequest


@dataclass
class TalkerPrompt:
    embeds: torch.Tensor  # [T, H_thinker]: the Talker projects them itself
    position_ids: torch.Tensor  # [3, T]
    rope_delta: int
    # The codec ids transformers' generate holds as the Talker's input ids (a mask id per
    # prompt position, then pad and bos): its repetition penalty counts them as seen.
    codec_history: list[int]


def media_token_ids(config: Any) -> tuple[int, int, int]:
    """The Thinker's audio, image and video placeholder ids (``Qwen2_5OmniConfig``)."""
    thinker = config.thinker_config
    return thinker.audio_token_index, thinker.image_token_index, thinker.video_token_index


class TalkerInputBuilder:
    # The session feeds each reply token's Thinker row (thinker_talker.speech_session).
    reads_reply_rows = True
    tokens_are_frames = True  # one codebook: each code the Talker samples is a frame

    def __init__(
        self,
        talker: Any,
        config: Any,
        thinker_embed_tokens: torch.Tensor,
        speakers: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``talker``: ``Qwen2_5OmniTalkerForConditionalGeneration``; ``config``: the whole
        model's ``Qwen2_5OmniConfig``; ``thinker_embed_tokens``: the Thinker's [V, H] table;
        ``speakers``: ``spk_dict.pt`` (each voice's first text token)."""
        self.talker = talker
        self.config = config
        self.embed = thinker_embed_tokens
        self.speakers = {name.lower(): v for name, v in (speakers or {}).items()}
        talker_cfg = config.talker_config
        self.eos_row = self.embed[talker_cfg.tts_text_end_token_id]
        self.pad_row = self.embed[talker_cfg.tts_text_pad_token_id]
        self.codec_pad = talker_cfg.tts_codec_pad_token_id
        self.codec_bos = talker_cfg.tts_codec_start_token_id
        self.codec_mask = talker_cfg.tts_codec_mask_token_id

    def reply_row(self, token_id: int, last_hidden: torch.Tensor) -> torch.Tensor:
        """The row reply token ``token_id`` gives the Talker: its last hidden + its embedding."""
        return last_hidden.to(self.embed.dtype) + self.embed[token_id]

    def trailing_row(
        self, token_id: int, last_hidden: torch.Tensor | None, is_last: bool
    ) -> torch.Tensor:
        """The row one later reply token contributes to one Talker step; the reply's last
        token (whose hidden row the Thinker never computes) stands as ``tts_text_eod``."""
        if is_last:
            return self.eos_row
        if last_hidden is None:
            raise ValueError("a reply token that is not the last needs its hidden row")
        return self.reply_row(token_id, last_hidden)

    @torch.no_grad()
    def build_prompt(
        self,
        prompt_ids: list[int],
        last_rows: torch.Tensor,
        first_token: int,
        first_hidden: torch.Tensor,
        bos_token: int,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        audio_seqlens: torch.Tensor | None = None,
        video_second_per_grid: torch.Tensor | None = None,
        use_audio_in_video: bool = False,
    ) -> TalkerPrompt:
        """``last_rows``: the Thinker's last hidden layer at the prompt positions ([T, H]);
        ``first_hidden``: at the reply's first token; ``bos_token``: the voice's first text
        token (``spk_dict.pt``'s ``bos_token``)."""
        ids = torch.tensor(prompt_ids)
        if last_rows.shape[0] != len(prompt_ids):
            raise ValueError("thinker rows do not cover the prompt")
        embeds = self.embed[ids].clone()
        embeds[torch.isin(ids, torch.tensor(media_token_ids(self.config)))] = 0
        codec = self.talker.get_input_embeddings()
        codec_rows = codec(torch.tensor([self.codec_pad, self.codec_bos], device=_device(codec)))
        tail = torch.stack(
            [self.embed[bos_token], self.reply_row(first_token, first_hidden)]
        ) + codec_rows.to(self.embed.device, self.embed.dtype)
        rows = torch.cat([last_rows.to(self.embed.dtype) + embeds, tail])

        text_ids = torch.cat([ids, torch.tensor([bos_token, first_token])])
        positions, delta = self.talker.get_rope_index(
            text_ids[None],
            image_grid_thw,
            video_grid_thw,
            torch.ones(1, len(text_ids), dtype=torch.long),
            use_audio_in_video,
            audio_seqlens,
            video_second_per_grid,
        )
        history = [self.codec_mask] * len(prompt_ids) + [self.codec_pad, self.codec_bos]
        return TalkerPrompt(rows, positions[:, 0], int(delta.flatten()[0]), history)

    def prompt(
        self,
        request: SpeakRequest,
        prompt_ids: list[int],
        rows: dict[int, torch.Tensor] | None,
        first_token: int,
        first_reply_row: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The session's feed (``TalkerFeed``): ``rows`` holds the Thinker's last layer at the
        prompt positions, ``first_reply_row`` its row of the first reply token."""
        speaker = self.speakers.get(request.voice.lower())
        if speaker is None:
            raise ValueError(f"unknown voice {request.voice!r}; voices: {sorted(self.speakers)}")
        if rows is None or first_reply_row is None:
            raise ValueError("the Qwen2.5-Omni Talker needs the Thinker's last-layer rows")
        prompt = self.build_prompt(
            prompt_ids,
            rows[max(rows)],
            first_token,
            first_reply_row,
            int(speaker["bos_token"]),
            image_grid_thw=_tensor(request.image_grid_thw),
            video_grid_thw=_tensor(request.video_grid_thw),
            audio_seqlens=_tensor(request.audio_seqlens),
            video_second_per_grid=_tensor(request.video_second_per_grid),
            use_audio_in_video=hears_videos(request),
        )
        extra = {
            "position_ids": prompt.position_ids,
            "rope_delta": prompt.rope_delta,
            PENALTY_HISTORY: prompt.codec_history,
        }
        return prompt.embeds, extra


def hears_videos(request: SpeakRequest) -> bool:
    """Whether the prompt's videos carry their audio tracks: the Thinker interleaved them, and
    this Talker places them interleaved too (transformers' generate hands it the flag)."""
    return bool((request.thinker.mm_processor_kwargs or {}).get("use_audio_in_video"))


def _tensor(small: Any) -> torch.Tensor | None:
    return None if small is None else torch.as_tensor(small)


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device
