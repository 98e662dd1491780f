"""The interface a Thinker-Talker family gives the stage deployments.

The deployments (Thinker, Talker, Code2wav) are the same for every family; what differs is
behind this: which sub-models a stage loads, what the Thinker captures for the Talker, how the
Talker's inputs are built, and which codec turns codes into audio. A family implements it in
``omni_serve/models/<family>/family.py``; ``omni_serve.models.registry.thinker_talker_family``
finds it by the pipeline config's ``family``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.ar.torch_engine import StepRunner
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob
from omni_serve.engines.encoders.item_cache import EncodedItemCache
from omni_serve.models.thinker_talker.speech_session import TalkerFeed
from omni_serve.models.thinker_talker.transcribe_prompt import TranscriptionPrompt

# The rate the families' codecs speak at (Qwen3-Omni's Code2wav and Qwen2.5-Omni's Token2Wav
# both make 24 kHz audio): the API encodes replies at it, and Realtime's PCM16 is 24 kHz too.
SAMPLE_RATE = 24_000


class CodecDecoder(Protocol):
    """What the codec stage runs: chunk jobs in, one float32 waveform per job out."""

    samples_per_frame: int
    streams: Any  # per-stream state with hit/miss counts, or None

    def run(self, jobs: list[DecodeJob]) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class ThinkerModel:
    """What the Thinker stage needs to know of its family's model for the Talker."""

    placeholders: dict[str, int]  # modality -> the prompt's placeholder token id
    merge_size: int  # the vision tower's spatial merge (patches per placeholder, per side)
    embed_tokens: torch.Tensor  # [V, H]: for prompts the encoder stage encoded
    accept_layer: int  # the layer whose rows the Talker reads at media positions
    # The layer whose rows the Talker reads at every prompt position and for each reply token
    # (Qwen2.5-Omni's last); None: only layer 0 and ``accept_layer``, only for media prompts.
    reply_layer: int | None = None

    def capture_layers(self, prompt_ids: list[int]) -> tuple[int, ...]:
        """The layers a spoken reply's Thinker captures for this prompt."""
        if self.reply_layer is not None:
            return (self.reply_layer,)
        if set(self.placeholders.values()).isdisjoint(prompt_ids):
            return ()  # the Talker looks the token embeddings up itself
        return (0, self.accept_layer)


@dataclass
class TalkerParts:
    """What the Talker stage runs: the step runner its torch engine drives, the feed that
    builds the runner's inputs from the Thinker's stream, and the family's sampling."""

    runner: StepRunner
    feed: TalkerFeed
    sampling_defaults: dict[str, Any]  # transformers' generate() defaults for the Talker
    stop_token_ids: tuple[int, ...]


class MediaEncoders(Protocol):
    """The encoder stage's work: each media item's Thinker rows (one tensor per item, on the
    host), from its item cache where the item was sent before."""

    cache: EncodedItemCache

    def audio(self, samples: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]: ...

    def images(self, images: Sequence[Any]) -> list[torch.Tensor]: ...

    def videos(self, videos: Sequence[Any]) -> list[torch.Tensor]: ...


class ThinkerTalkerFamily(Protocol):
    name: str
    transcription: TranscriptionPrompt  # what a clip to transcribe is asked, in which languages

    def thinker_model(self, model_path: Path) -> ThinkerModel: ...

    def voices(self, model_path: Path) -> list[str]:
        """The voices the Talker speaks in, lower-case (the API's ``voice`` values)."""

    def audio_tokens(self, processor: Any, frames: torch.Tensor) -> torch.Tensor:
        """How many Thinker positions each clip of ``frames`` mel frames takes: the family's
        processor rule (prompts count their length without a second mel pass)."""

    def longest_clip(self, processor: Any) -> int | None:
        """The most samples of one audio clip the Thinker hears (None: no bound). A longer clip
        would be cut short by the processor, unseen: the ingress refuses it instead."""

    def load_talker(
        self,
        model_path: Path,
        dtype: torch.dtype,
        device: str,
        engine: EngineSettings,
        max_len: int,
    ) -> TalkerParts:
        """The Talker with its runner sized by ``engine`` (batch, CUDA graphs) and ``max_len``."""

    def load_codec(
        self, model_path: Path, dtype: torch.dtype, device: str, engine: EngineSettings
    ) -> tuple[CodecDecoder, CodecInfo]:
        """The codec stage's decoder and its streaming plan (from ``engine.args``)."""

    def load_encoders(
        self, model_path: Path, dtype: torch.dtype, device: str, cache_bytes: int
    ) -> MediaEncoders:
        """The encoder stage's towers behind an item cache of ``cache_bytes``. A family
        without an encoder stage raises ValueError (its pipeline config is refused first:
        ``omni_serve.config.engine.FAMILY_STAGE_KINDS``)."""
