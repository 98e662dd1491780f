"""Qwen3-Omni's Code2wav behind the generic chunked codec decoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omni_serve.engines.codec.chunked import CodecDecoder, DecodeJob
from omni_serve.models.qwen3_omni.checkpoint import load_code2wav
from omni_serve.models.qwen3_omni.code2wav_streams import Code2wavStreams
from omni_serve.models.qwen3_omni.snake import use_in_place_snake

SAMPLE_RATE = 24_000
# Frames of history the causal upsampling/decoder convs after Code2wav's transformer need
# (measured with chunks 2..25 on both presets: 5 frames are exact to 1.4e-5, 4 drift by 0.09);
# 6 keeps one frame of margin. Each frame of history is ~3% of a steady chunk's decode.
CONV_HISTORY_FRAMES = 6
# Frames beyond the transformer's receptive field that the left context needs (measured).
_CONV_MARGIN_FRAMES = 4


def exact_left_context(code2wav_config: Any) -> int:
    """Left context (frames) for which a chunk's decode equals the full decode.

    Each of the transformer's layers attends ``sliding_window`` frames back, so the receptive
    field is layers x window, plus the convs' margin (measured: 76 frames for 1 layer, 292 for
    4; less context drifts, e.g. 0.13 max abs error at 72 with 1 layer).
    """
    return code2wav_config.num_hidden_layers * code2wav_config.sliding_window + _CONV_MARGIN_FRAMES


def load_code2wav_decoder(
    checkpoint: str | Path,
    dtype: torch.dtype = torch.float32,
    max_batch: int = 1,
    stream_state: bool = True,
    device: str = "cpu",
) -> tuple[CodecDecoder, int]:
    """The batched decoder and its exact left context in frames. ``stream_state``: keep each
    stream's transformer state between its jobs (``Code2wavStreams``; exact either way).
    ``device``: where the model runs; codes come and waveforms go back on the CPU."""
    code2wav, config = load_code2wav(checkpoint, dtype, device)
    use_in_place_snake(code2wav)
    streams = Code2wavStreams(code2wav) if stream_state else None

    def transformer_rows(
        codes: torch.Tensor, trims: list[int], jobs: list[DecodeJob]
    ) -> list[torch.Tensor]:
        """Per batch row, the transformer's output from frame ``trims[i]`` of ``codes`` on:
        from the stream's state when it has one, else over all of ``codes[i]``."""
        out: list[torch.Tensor | None] = [None] * codes.shape[0]
        for i, job in enumerate(jobs):
            if streams is not None and job.stream_id is not None:
                out[i] = streams.rows(job, job.context_start + trims[i])
        cold = [i for i, rows in enumerate(out) if rows is None]
        if cold:
            hidden = code2wav.code_embedding(codes[cold] + code2wav.code_offset).mean(1)
            hidden = code2wav.pre_transformer(inputs_embeds=hidden).last_hidden_state
            for k, i in enumerate(cold):
                width = jobs[i].codes.shape[1] if i < len(jobs) else codes.shape[2]
                out[i] = hidden[k, trims[i] : width]
        return out

    def decode(
        codes: torch.Tensor, trims: list[int] | None = None, jobs: list[DecodeJob] | None = None
    ) -> torch.Tensor:
        """transformers' ``Qwen3OmniMoeCode2Wav.forward``, split: the windowed transformer
        (it needs the long context, and runs at frame rate: cheap), then the upsampling and
        decoder convs (sample rate: the cost) from frame ``trims[i]`` on."""
        trims = trims or [0] * codes.shape[0]
        per_row = transformer_rows(codes.to(device), trims, jobs or [])
        length = max(r.shape[0] for r in per_row)
        rows = per_row[0].new_zeros(len(per_row), length, per_row[0].shape[1])
        for i, r in enumerate(per_row):
            rows[i, : r.shape[0]] = r
        x = rows.permute(0, 2, 1)
        for blocks in code2wav.upsample:
            for block in blocks:
                x = block(x)
        for block in code2wav.decoder:
            x = block(x)
        return x.clamp(min=-1, max=1)[:, 0].float().cpu()

    decoder = CodecDecoder(
        decode,
        samples_per_frame=int(code2wav.total_upsample),
        conv_history=CONV_HISTORY_FRAMES,
        max_batch=max_batch,
    )
    decoder.streams = streams
    return decoder, exact_left_context(config.code2wav_config)
