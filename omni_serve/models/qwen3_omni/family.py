"""Qwen3-Omni behind the Thinker-Talker family interface (``thinker_talker/family.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.codec.chunked import CodecInfo
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder
from omni_serve.models.thinker_talker.family import CodecDecoder


class Qwen3OmniFamily:
    name = "qwen3_omni"

    def load_codec(
        self, model_path: Path, dtype: torch.dtype, device: str, engine: EngineSettings
    ) -> tuple[CodecDecoder, CodecInfo]:
        """Code2wav, its chunks planned by frames: a small first chunk (first audio fast),
        growing to the steady size."""
        decoder, left_context = load_code2wav_decoder(
            model_path, dtype, max_batch=engine.max_batch_size, device=device
        )
        args = engine.args
        info = CodecInfo(
            decoder.samples_per_frame,
            left_context,
            first_chunk_frames=int(args.get("first_chunk_frames", 2)),
            chunk_frames=int(args.get("chunk_frames", 25)),
            chunk_growth=float(args.get("chunk_growth", 2.0)),
        )
        return decoder, info


FAMILY = Qwen3OmniFamily()
