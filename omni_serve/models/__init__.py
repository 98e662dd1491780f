"""Model families. Each ``<family>/`` holds everything model-specific, including a factory that
builds a random-weight checkpoint of the real architecture (no weights can be downloaded here)."""

from omni_serve.models.registry import ensure_model, presets, resolve_model

__all__ = ["ensure_model", "presets", "resolve_model"]
