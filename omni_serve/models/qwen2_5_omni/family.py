"""Qwen2.5-Omni behind the Thinker-Talker family interface (``thinker_talker/family.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from omni_serve.config import EngineSettings
from omni_serve.engines.codec.chunked import CodecInfo
from omni_serve.models.qwen2_5_omni.checkpoint import (
    load_config,
    load_speakers,
    load_talker,
    load_thinker_embeddings,
    load_token2wav,
)
from omni_serve.models.qwen2_5_omni.talker_inputs import TalkerInputBuilder, media_token_ids
from omni_serve.models.qwen2_5_omni.talker_static_runner import talker_runner
from omni_serve.models.qwen2_5_omni.token2wav import Token2WavDecoder, Token2WavSettings
from omni_serve.models.thinker_talker.family import CodecDecoder, TalkerParts, ThinkerModel
from omni_serve.models.thinker_talker.transcribe_prompt import TranscriptionPrompt

if TYPE_CHECKING:
    from omni_serve.models.thinker_talker.encoder_items import CachedEncoders

# transformers' Qwen2.5-Omni generate() defaults for the Talker (it samples by default).
TALKER_DEFAULTS = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05}
# The languages Qwen2.5-Omni's model card evaluates speech recognition in (Common Voice 15:
# en, zh, yue, fr; Fleurs, WenetSpeech and VoxPopuli add none), by ISO 639-1 code (Cantonese
# by ISO 639-3). The card lists no wider set.
SPEECH_LANGUAGES = {"en": "English", "zh": "Chinese", "yue": "Cantonese", "fr": "French"}


class Qwen25OmniFamily:
    name = "qwen2_5_omni"
    transcription = TranscriptionPrompt(SPEECH_LANGUAGES)

    def thinker_model(self, model_path: Path) -> ThinkerModel:
        """The Talker reads the Thinker's last layer (the final norm's output) everywhere."""
        config = load_config(model_path)
        modalities = ("audio", "image", "video")
        last = config.thinker_config.text_config.num_hidden_layers
        return ThinkerModel(
            placeholders=dict(zip(modalities, media_token_ids(config), strict=True)),
            merge_size=config.thinker_config.vision_config.spatial_merge_size,
            embed_tokens=load_thinker_embeddings(model_path),
            accept_layer=last,
            reply_layer=last,
        )

    def audio_tokens(self, processor: Any, frames: torch.Tensor) -> torch.Tensor:
        """``Qwen2_5OmniProcessor``'s rule: the audio tower's conv, then its 2x pooling."""
        return ((frames - 1) // 2 + 1 - 2) // 2 + 1

    def longest_clip(self, processor: Any) -> int | None:
        """``Qwen2_5OmniProcessor`` pads and truncates each clip to the feature extractor's
        window (30 s), as vLLM calls it."""
        return processor.feature_extractor.n_samples

    def voices(self, model_path: Path) -> list[str]:
        return sorted(v.lower() for v in load_speakers(model_path))

    def load_talker(
        self,
        model_path: Path,
        dtype: torch.dtype,
        device: str,
        engine: EngineSettings,
        max_len: int,
    ) -> TalkerParts:
        talker, config = load_talker(model_path, dtype=dtype, device=device)
        embed = load_thinker_embeddings(model_path)
        builder = TalkerInputBuilder(talker, config, embed, load_speakers(model_path))
        runner = talker_runner(talker, builder.pad_row, engine, max_len)
        return TalkerParts(runner, builder, TALKER_DEFAULTS, runner.stop_token_ids)

    def load_codec(
        self, model_path: Path, dtype: torch.dtype, device: str, engine: EngineSettings
    ) -> tuple[CodecDecoder, CodecInfo]:
        """Token2Wav (float32 whatever ``dtype``: see ``load_token2wav``), chunked by DiT blocks
        with the ODE and context of ``engine.args``."""
        token2wav, _ = load_token2wav(model_path, device)
        settings = Token2WavSettings.from_args(dict(engine.args))
        decoder = Token2WavDecoder(token2wav, load_speakers(model_path), settings)
        return decoder, decoder.codec_info()

    def load_encoders(
        self, model_path: Path, dtype: torch.dtype, device: str, cache_bytes: int
    ) -> CachedEncoders:
        """The audio and vision towers on their own (``encoders.py``), behind the item cache.
        Imported here: only the encoder stage loads the towers' modeling code."""
        from omni_serve.engines.encoders.item_cache import EncodedItemCache
        from omni_serve.models.qwen2_5_omni.encoders import Qwen25OmniEncoders
        from omni_serve.models.thinker_talker.encoder_items import CachedEncoders

        towers = Qwen25OmniEncoders(model_path, dtype, device)
        return CachedEncoders(towers, EncodedItemCache(cache_bytes))


FAMILY = Qwen25OmniFamily()
