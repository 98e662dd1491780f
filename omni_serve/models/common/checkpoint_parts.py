"""Load one sub-model of a checkpoint (a Talker, a codec) without the rest.

A stage only needs its own weights: the Talker stage of a 30B model must not load the
Thinker's. Reads only the tensors under the sub-model's prefix, from a single or sharded
safetensors checkpoint, exactly as ``from_pretrained`` lays them out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def _shards(checkpoint: Path, prefix: str) -> dict[Path, list[str]]:
    index = checkpoint / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        by_file: dict[Path, list[str]] = {}
        for name, file in weight_map.items():
            if name.startswith(prefix):
                by_file.setdefault(checkpoint / file, []).append(name)
        return by_file
    single = checkpoint / "model.safetensors"
    with safe_open(single, "pt") as f:
        names = [k for k in f.keys() if k.startswith(prefix)]  # noqa: SIM118 (no __iter__)
        return {single: names}


def load_tensors(checkpoint: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors whose names start with ``prefix``, with the prefix stripped."""
    tensors = {}
    for file, names in _shards(Path(checkpoint), prefix).items():
        with safe_open(file, "pt") as f:
            for name in names:
                tensors[name[len(prefix) :]] = f.get_tensor(name)
    if not tensors:
        raise KeyError(f"no tensors under {prefix!r} in {checkpoint}")
    return tensors


def load_submodule(
    module: nn.Module,
    checkpoint: str | Path,
    prefix: str,
    convert: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> nn.Module:
    """``convert``: the family's checkpoint-to-module layout change, where it has one."""
    state = load_tensors(checkpoint, prefix)
    if convert is not None:
        state = convert(state)
    missing, unexpected = module.load_state_dict(state, strict=False)
    # Tied weights are stored once; anything else missing is a real error.
    missing = [m for m in missing if not _is_tied(module, m)]
    if missing or unexpected:
        raise RuntimeError(f"{prefix}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return module.eval()


def _is_tied(module: nn.Module, name: str) -> bool:
    tied = getattr(module, "_tied_weights_keys", None) or {}
    return name in tied
