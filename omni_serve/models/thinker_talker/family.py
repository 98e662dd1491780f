"""The interface a Thinker-Talker family gives the stage deployments.

The deployments (Thinker, Talker, Code2wav) are the same for every family; what differs is
behind this: which sub-models a stage loads, what the Thinker captures for the Talker, how the
Talker's inputs are built, and which codec turns codes into audio. A family implements it in
``omni_serve/models/<family>/family.py``; ``omni_serve.models.registry.thinker_talker_family``
finds it by the pipeline config's ``family``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob


class CodecDecoder(Protocol):
    """What the codec stage runs: chunk jobs in, one float32 waveform per job out."""

    samples_per_frame: int
    streams: Any  # per-stream state with hit/miss counts, or None

    def run(self, jobs: list[DecodeJob]) -> list[torch.Tensor]: ...


class ThinkerTalkerFamily(Protocol):
    name: str

    def load_codec(
        self, model_path: Path, dtype: torch.dtype, device: str, engine: EngineSettings
    ) -> tuple[CodecDecoder, CodecInfo]:
        """The codec stage's decoder and its streaming plan (from ``engine.args``)."""
