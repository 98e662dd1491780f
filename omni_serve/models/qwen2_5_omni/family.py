"""Qwen2.5-Omni behind the Thinker-Talker family interface (``thinker_talker/family.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.codec.chunked import CodecInfo
from omni_serve.models.qwen2_5_omni.checkpoint import load_speakers, load_token2wav
from omni_serve.models.qwen2_5_omni.token2wav import Token2WavDecoder, Token2WavSettings
from omni_serve.models.thinker_talker.family import CodecDecoder


class Qwen25OmniFamily:
    name = "qwen2_5_omni"

    def load_codec(
        self, model_path: Path, dtype: torch.dtype, device: str, engine: EngineSettings
    ) -> tuple[CodecDecoder, CodecInfo]:
        """Token2Wav (float32 whatever ``dtype``: see ``load_token2wav``), chunked by DiT blocks
        with the ODE and context of ``engine.args``."""
        token2wav, _ = load_token2wav(model_path, device)
        settings = Token2WavSettings.from_args(dict(engine.args))
        decoder = Token2WavDecoder(token2wav, load_speakers(model_path), settings)
        return decoder, decoder.codec_info()


FAMILY = Qwen25OmniFamily()
