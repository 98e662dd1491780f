"""Load one Qwen3-Omni sub-model (talker, code2wav, ...) from a checkpoint without the rest
(``models/common/checkpoint_parts``), its MoE experts fused as transformers 5 holds them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_serve.models.common import checkpoint_parts
from omni_serve.models.common.checkpoint_parts import load_tensors


def load_config(checkpoint: str | Path) -> Any:  # Qwen3OmniMoeConfig
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig.from_pretrained(checkpoint)


_EXPERT_KEY = re.compile(
    r"^(?P<base>.*\.experts)\.(?P<idx>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


def fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors -> transformers 5's fused 3-D expert parameters.

    Checkpoints store MoE experts one Linear at a time (``experts.3.gate_proj.weight``);
    transformers 5 modules hold ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj``
    [E, H, I]. ``from_pretrained`` converts on load; this does the same for a sub-model.
    """
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in state.items():
        match = _EXPERT_KEY.match(name)
        if match is None:
            out[name] = tensor
            continue
        groups.setdefault(match["base"], {}).setdefault(match["proj"], {})[int(match["idx"])] = (
            tensor
        )
    for base, projs in groups.items():
        n = len(projs["down_proj"])
        gate = [projs["gate_proj"][i] for i in range(n)]
        up = [projs["up_proj"][i] for i in range(n)]
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat(gu) for gu in zip(gate, up, strict=True)]
        )
        out[f"{base}.down_proj"] = torch.stack([projs["down_proj"][i] for i in range(n)])
    return out


def load_submodule(module: nn.Module, checkpoint: str | Path, prefix: str) -> nn.Module:
    return checkpoint_parts.load_submodule(module, checkpoint, prefix, fuse_experts)


def load_talker(
    checkpoint: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[nn.Module, Any]:
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    from omni_serve.compat.transformers import qwen3_omni_talker_audio_config

    config = load_config(checkpoint)
    if not config.enable_audio_output:
        raise ValueError(
            f"{checkpoint} has no Talker (enable_audio_output is false, as in the "
            "Thinking and Captioner checkpoints): leave the talker and code2wav "
            "stages out of the pipeline config to serve it in text"
        )
    talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(config.talker_config)
    load_submodule(talker, checkpoint, "talker.")
    qwen3_omni_talker_audio_config(talker, config.thinker_config)
    return talker.to(device=device, dtype=dtype), config


def load_code2wav(
    checkpoint: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[nn.Module, Any]:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = load_config(checkpoint)
    code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config)
    load_submodule(code2wav, checkpoint, "code2wav.")
    return code2wav.to(device=device, dtype=dtype), config


def load_thinker_embeddings(checkpoint: str | Path) -> torch.Tensor:
    """The thinker's token embedding matrix [V, H] (the Talker embeds text tokens with it)."""
    return load_tensors(checkpoint, "thinker.model.embed_tokens.")["weight"]
