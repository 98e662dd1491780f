"""The shared session's tests run Qwen3-Omni's Talker (its fixtures)."""

from tests.omni_serve.models.qwen3_omni.conftest import talker_parts  # noqa: F401
