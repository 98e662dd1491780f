"""An ``OmniIngress`` built without Serve or stages, for tests of its routes' own logic."""

from __future__ import annotations

import types
from typing import Any

from deployments.omni_chat import OmniChat
from deployments.omni_ingress import OmniIngress
from omni_serve.config import ApiSettings
from omni_serve.observability.metrics import ApiMetrics

# The class under Serve's deployment wrapper: its methods, callable on a bare instance.
IngressClass = next(k for k in OmniIngress.func_or_class.__mro__[1:] if k.__name__ == "OmniIngress")


def bare_ingress(prompts: Any = None) -> Any:
    """An ingress serving "qwen3-omni" with the voice "ethan", a 30 s request timeout and its
    own metrics; ``prompts``: the chat's prompt builder (None: a test replaces what reads it)."""
    ingress = object.__new__(IngressClass)
    ingress.config = types.SimpleNamespace(
        served_model_name="qwen3-omni", api=ApiSettings(request_timeout_s=30.0)
    )
    ingress.metrics = ApiMetrics()
    ingress.chat = OmniChat(
        ingress.config,
        prompts,
        None,
        ingress.metrics,
        voices={"ethan"},
        speaks=True,
        context_tokens=4096,
        media_limits={},
    )
    return ingress
