"""Thinker → Talker glue: the Talker's prompt and its per-step text rows.

Mirrors ``Qwen3OmniMoeForConditionalGeneration.generate`` (transformers 5.19) but in streaming
form: the prompt needs only the Thinker's prompt rows and its FIRST generated token, and every
later Thinker token becomes one "trailing" row the Talker adds to one decode step. The last
Thinker token is replaced by ``tts_eos``; after it the Talker gets ``tts_pad``.

The Talker reads the Thinker's ``accept_hidden_layer`` only at media positions (audio, image,
video placeholders); everywhere else it reads layer 0, the token embeddings, which it can look
up in its own copy of the table. So a prompt without media needs no captured rows at all: the
Thinker sends ``TOKEN_EMBEDDINGS`` instead, computes nothing extra, and may serve the prompt
from its prefix cache (rows of cached tokens are never computed, so never captured).

Rows arrive on the CPU (from the channel; the embedding table stays there too: it is the
Thinker's, vocabulary x hidden) and are projected where the Talker's weights are; position ids
stay on the CPU (the runner moves them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from omni_serve.models.thinker_talker.messages import SpeakRequest


def _tensor(small: Any) -> torch.Tensor | None:
    """A request's grid or lengths (lists on the wire) as the tensor the builder takes."""
    return None if small is None else torch.as_tensor(small)


def media_token_ids(config: Any) -> tuple[int, int, int]:
    """The Thinker's audio, image and video placeholder ids."""
    thinker = config.thinker_config
    return thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id


@dataclass
class TalkerPrompt:
    embeds: torch.Tensor  # [T, H_talker]
    position_ids: torch.Tensor  # [3, T]
    rope_delta: int


class TalkerInputBuilder:
    def __init__(self, talker: nn.Module, config: Any, thinker_embed_tokens: torch.Tensor) -> None:
        self.talker = talker
        self.config = config
        self.thinker_embed = thinker_embed_tokens  # [V, H_thinker]
        ids = torch.tensor(
            [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        )
        with torch.no_grad():
            self.tts_bos, self.tts_eos, self.tts_pad = self._text_rows(ids)

    # -- rows ------------------------------------------------------------------------------

    def _text_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.talker.text_projection(self._on_device(self.thinker_embed[token_ids]))

    def _on_device(self, rows: torch.Tensor) -> torch.Tensor:
        weight = self.talker.codec_head.weight
        return rows.to(weight.device, weight.dtype)

    @property
    def _dtype(self) -> torch.dtype:
        return self.talker.codec_head.weight.dtype

    @torch.no_grad()
    def trailing_row(
        self, token_id: int, reply_row: torch.Tensor | None, is_last: bool
    ) -> torch.Tensor:
        """The row one later Thinker token contributes to one Talker step (``reply_row``: not
        read, this Talker needs only the token)."""
        if is_last:
            return self.tts_eos
        return self._text_rows(torch.tensor([token_id]))[0]

    # -- the session's feed (thinker_talker.speech_session.TalkerFeed) ----------------------

    reads_reply_rows = False
    tokens_are_frames = False

    def prompt(
        self,
        request: SpeakRequest,
        prompt_ids: list[int],
        rows: dict[int, torch.Tensor] | None,
        first_token: int,
        first_reply_row: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``rows``: layer 0 and the accept layer's rows of the prompt; None without media (the
        builder looks the token embeddings up)."""
        embed_rows = accept_rows = None
        if rows is not None:
            layers = sorted(rows)
            embed_rows, accept_rows = rows[layers[0]], rows[layers[-1]]
        prompt = self.build_prompt(
            prompt_ids,
            embed_rows,
            accept_rows,
            first_token,
            request.voice,
            image_grid_thw=_tensor(request.image_grid_thw),
            video_grid_thw=_tensor(request.video_grid_thw),
            video_second_per_grid=_tensor(request.video_second_per_grid),
            audio_seqlens=_tensor(request.audio_seqlens),
        )
        return prompt.embeds, {"position_ids": prompt.position_ids, "rope_delta": prompt.rope_delta}

    # -- prompt ----------------------------------------------------------------------------

    @torch.no_grad()
    def build_prompt(
        self,
        prompt_ids: list[int],
        embed_rows: torch.Tensor | None,
        accept_rows: torch.Tensor | None,
        first_token: int,
        speaker: str,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        audio_seqlens: torch.Tensor | None = None,
        video_second_per_grid: torch.Tensor | None = None,
    ) -> TalkerPrompt:
        """``embed_rows``/``accept_rows``: Thinker layer-0 and ``accept_hidden_layer`` rows of
        the prompt positions ([T, H_thinker]); the prompt must end with the generation prompt
        ``<|im_start|>assistant\\n``. ``embed_rows`` None: looked up in the token embeddings
        (the same rows at every text position); ``accept_rows`` None: only for a prompt without
        media."""
        cfg = self.config
        talker_cfg = cfg.talker_config
        speaker_id = talker_cfg.speaker_id.get(speaker.lower())
        if speaker_id is None:
            raise ValueError(f"unknown voice {speaker!r}; voices: {sorted(talker_cfg.speaker_id)}")
        ids = torch.tensor(prompt_ids)
        multimodal = torch.isin(ids, torch.tensor(media_token_ids(cfg)))
        if embed_rows is None:
            embed_rows = self.thinker_embed[ids]
        if accept_rows is None:
            if multimodal.any():
                raise ValueError("a prompt with media needs the Thinker's captured rows")
            accept_rows = embed_rows  # never read: no media positions
        if embed_rows.shape[0] != len(prompt_ids) or accept_rows.shape[0] != len(prompt_ids):
            raise ValueError("thinker rows do not cover the prompt")
        user_idx = self._user_positions(ids)
        dtype, device = self._dtype, self.talker.codec_head.weight.device
        hidden = talker_cfg.text_config.hidden_size
        user = torch.empty(len(user_idx), hidden, dtype=dtype, device=device)
        mm = multimodal[user_idx]
        if mm.any():
            rows = self.talker.hidden_projection(self._on_device(accept_rows[user_idx][mm]))
            user[mm.to(device)] = rows
        rows = self.talker.text_projection(self._on_device(embed_rows[user_idx][~mm]))
        user[(~mm).to(device)] = rows

        start = self._assistant_start(ids)
        role_rows = self.talker.text_projection(self._on_device(embed_rows[start : start + 3]))
        first = self._text_rows(torch.tensor([first_token]))
        text_part = torch.cat([role_rows, self.tts_pad.expand(4, -1), self.tts_bos[None], first])
        codec_ids = torch.tensor(
            [
                talker_cfg.codec_nothink_id,
                talker_cfg.codec_think_bos_id,
                talker_cfg.codec_think_eos_id,
                speaker_id,
                talker_cfg.codec_pad_id,
                talker_cfg.codec_bos_id,
            ]
        )
        codec_part = torch.cat(
            [
                torch.zeros(3, user.shape[1], dtype=dtype, device=device),
                self.talker.get_input_embeddings()(codec_ids.to(device)),
            ]
        )
        embeds = torch.cat([user, text_part + codec_part])

        talker_ids = torch.cat([ids[user_idx], torch.full((9,), cfg.tts_pad_token_id)])
        has_mm = audio_seqlens is not None or any(
            g is not None and g.numel() > 0 for g in (image_grid_thw, video_grid_thw)
        )
        if has_mm:
            # use_audio_in_video False even where the prompt interleaves a video's audio with
            # its frames: transformers 5.19's generate, Qwen's reference path, hands the Talker
            # only the grids (its talker_kwargs take no use_audio_in_video), and the served
            # speech is held to equal it.
            positions, delta = self.talker.get_rope_index(
                talker_ids[None],
                image_grid_thw,
                video_grid_thw,
                torch.ones(1, len(talker_ids), dtype=torch.long),
                False,
                audio_seqlens,
                video_second_per_grid,
            )
            return TalkerPrompt(embeds, positions[:, 0], int(delta.flatten()[0]))
        positions = torch.arange(len(talker_ids)).expand(3, -1)
        return TalkerPrompt(embeds, positions, 0)

    def _user_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Positions in user turns (their <|im_start|>user ... <|im_end|>\\n), in order."""
        cfg = self.config
        pos = torch.arange(len(ids))
        im_start = torch.where(ids == cfg.im_start_token_id, pos, torch.full_like(pos, -1))
        previous = torch.cummax(im_start, dim=0).values.clamp_min(0)
        roles = ids[(previous + 1).clamp_max(len(ids) - 1)]
        return pos[roles == cfg.user_token_id]

    def _assistant_start(self, ids: torch.Tensor) -> int:
        cfg = self.config
        hits = ((ids[:-1] == cfg.im_start_token_id) & (ids[1:] == cfg.assistant_token_id)).nonzero()
        if len(hits) == 0 or int(hits[-1]) + 3 != len(ids):
            raise ValueError("prompt must end with the generation prompt <|im_start|>assistant\\n")
        return int(hits[-1])
