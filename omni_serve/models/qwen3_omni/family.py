"""Qwen3-Omni behind the Thinker-Talker family interface (``thinker_talker/family.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    _get_feat_extract_output_lengths,
)

from omni_serve.config import EngineSettings
from omni_serve.engines.codec.chunked import CodecInfo
from omni_serve.models.qwen3_omni.checkpoint import (
    load_config,
    load_talker,
    load_thinker_embeddings,
)
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder, media_token_ids
from omni_serve.models.qwen3_omni.talker_static_runner import talker_runner
from omni_serve.models.thinker_talker.family import CodecDecoder, TalkerParts, ThinkerModel
from omni_serve.models.thinker_talker.transcribe_prompt import TranscriptionPrompt

if TYPE_CHECKING:
    from omni_serve.models.thinker_talker.encoder_items import CachedEncoders

# transformers' Qwen3-Omni generate() defaults for the Talker (it samples by default).
TALKER_DEFAULTS = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05}
# Qwen3-Omni's speech input languages as its model card lists them, by ISO 639-1 code
# (Cantonese by ISO 639-3).
SPEECH_LANGUAGES = {
    "en": "English",
    "zh": "Chinese",
    "ko": "Korean",
    "ja": "Japanese",
    "de": "German",
    "ru": "Russian",
    "it": "Italian",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "ms": "Malay",
    "nl": "Dutch",
    "id": "Indonesian",
    "tr": "Turkish",
    "vi": "Vietnamese",
    "yue": "Cantonese",
    "ar": "Arabic",
    "ur": "Urdu",
}


class Qwen3OmniFamily:
    name = "qwen3_omni"
    transcription = TranscriptionPrompt(SPEECH_LANGUAGES)

    def thinker_model(self, model_path: Path) -> ThinkerModel:
        config = load_config(model_path)
        modalities = ("audio", "image", "video")
        return ThinkerModel(
            placeholders=dict(zip(modalities, media_token_ids(config), strict=True)),
            merge_size=config.thinker_config.vision_config.spatial_merge_size,
            embed_tokens=load_thinker_embeddings(model_path),
            accept_layer=config.talker_config.accept_hidden_layer,
        )

    def audio_tokens(self, processor: Any, frames: torch.Tensor) -> torch.Tensor:
        """The processor's rule with its merged ``n_window`` (the audio tower's chunking)."""
        merged = processor._merge_kwargs(
            processor.valid_processor_kwargs,
            tokenizer_init_kwargs=processor.tokenizer.init_kwargs,
        )
        n_window = merged["audio_kwargs"].get("n_window", 50)
        return _get_feat_extract_output_lengths(frames, n_window)

    def longest_clip(self, processor: Any) -> int | None:
        """None: the processor extracts a clip's features whole (no truncation)."""
        return None

    def voices(self, model_path: Path) -> list[str]:
        return sorted(v.lower() for v in load_config(model_path).talker_config.speaker_id)

    def load_talker(
        self,
        model_path: Path,
        dtype: torch.dtype,
        device: str,
        engine: EngineSettings,
        max_len: int,
    ) -> TalkerParts:
        """The Talker and its code predictor (``talker_runner``: CUDA graphs where asked)."""
        talker, config = load_talker(model_path, dtype=dtype, device=device)
        builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(model_path))
        runner = talker_runner(talker, builder.tts_pad, engine, max_len)
        return TalkerParts(runner, builder, TALKER_DEFAULTS, (runner.codec_eos_token_id,))

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

    def load_encoders(
        self, model_path: Path, dtype: torch.dtype, device: str, cache_bytes: int
    ) -> CachedEncoders:
        """The audio and vision towers on their own (``encoders.py``), behind the item cache.
        Imported here: only the encoder stage loads the towers' modeling code."""
        from omni_serve.engines.encoders.item_cache import EncodedItemCache
        from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
        from omni_serve.models.thinker_talker.encoder_items import CachedEncoders

        towers = Qwen3OmniEncoders(model_path, dtype, device)
        return CachedEncoders(towers, EncodedItemCache(cache_bytes))


FAMILY = Qwen3OmniFamily()
