"""Load one Qwen2.5-Omni sub-model (the Talker, Token2Wav) from a checkpoint without the rest
(``models/common/checkpoint_parts``), and the voices of ``spk_dict.pt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omni_serve.models.common.checkpoint_parts import load_submodule, load_tensors


def load_config(checkpoint: str | Path) -> Any:
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig.from_pretrained(checkpoint)


def _needs_audio_output(config: Any, checkpoint: str | Path) -> None:
    if not config.enable_audio_output:
        raise ValueError(
            f"{checkpoint} has no Talker (enable_audio_output is false): leave the talker "
            "and code2wav stages out of the pipeline config to serve it in text"
        )


def load_talker(
    checkpoint: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.nn.Module, Any]:
    from transformers import Qwen2_5OmniTalkerForConditionalGeneration

    config = load_config(checkpoint)
    _needs_audio_output(config, checkpoint)
    talker = Qwen2_5OmniTalkerForConditionalGeneration._from_config(config.talker_config)
    load_submodule(talker, checkpoint, "talker.")
    return talker.to(device=device, dtype=dtype), config


def load_token2wav(checkpoint: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, Any]:
    """Float32 always: transformers runs Token2Wav in float32 whatever the model's dtype (its
    DiT's ODE and BigVGAN's clamped output are not made for half precision)."""
    from transformers import Qwen2_5OmniToken2WavModel

    config = load_config(checkpoint)
    _needs_audio_output(config, checkpoint)
    token2wav = Qwen2_5OmniToken2WavModel._from_config(config.token2wav_config)
    load_submodule(token2wav, checkpoint, "token2wav.")
    return token2wav.to(device=device, dtype=torch.float32), config


def load_speakers(checkpoint: str | Path) -> dict[str, dict[str, Any]]:
    """Each voice's Token2Wav conditioning and the text token its replies start with."""
    path = Path(checkpoint) / "spk_dict.pt"
    if not path.exists():
        raise FileNotFoundError(f"{checkpoint} has no spk_dict.pt (the voices Token2Wav needs)")
    return torch.load(path, weights_only=True)


def load_thinker_embeddings(checkpoint: str | Path) -> torch.Tensor:
    """The Thinker's token embedding matrix [V, H] (the Talker reads text tokens through it)."""
    return load_tensors(checkpoint, "thinker.model.embed_tokens.")["weight"]
