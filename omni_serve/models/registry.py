"""Preset name → model family factory, and the one entry point that builds or finds a checkpoint."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from omni_serve.models.cache import build_atomically

if TYPE_CHECKING:
    from omni_serve.models.thinker_talker.family import ThinkerTalkerFamily


def _families() -> list[ModuleType]:
    from omni_serve.models.qwen2_5_omni import factory as qwen2_5_omni
    from omni_serve.models.qwen3_omni import factory as qwen3_omni
    from omni_serve.models.qwen_image import factory as qwen_image

    return [qwen3_omni, qwen2_5_omni, qwen_image]


def thinker_talker_family(name: str) -> ThinkerTalkerFamily:
    """The stage-side glue of a Thinker-Talker family, by a pipeline config's ``family``."""
    if name == "qwen3_omni":
        from omni_serve.models.qwen3_omni.family import FAMILY
    elif name == "qwen2_5_omni":
        from omni_serve.models.qwen2_5_omni.family import FAMILY
    else:
        raise KeyError(f"{name!r} is not a Thinker-Talker family (qwen3_omni, qwen2_5_omni)")
    return FAMILY


def presets() -> list[str]:
    return [name for family in _families() for name in family.PRESETS]


def _factory(preset: str) -> ModuleType:
    for family in _families():
        if preset in family.PRESETS:
            return family
    raise KeyError(f"unknown preset {preset!r}; known presets: {', '.join(presets())}")


def ensure_model(preset: str, root: Path | None = None) -> Path:
    """Path of the preset's checkpoint, building it first if the cache does not have it."""
    factory = _factory(preset)
    return build_atomically(
        preset, factory.spec(preset), lambda tmp: factory.build(preset, tmp), root=root
    )


def resolve_model(model: str) -> Path:
    """A pipeline config's ``model`` value: a preset name, or a checkpoint directory."""
    if model in presets():
        return ensure_model(model)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {model!r} is neither a preset ({', '.join(presets())}) nor a directory"
        )
    return path
