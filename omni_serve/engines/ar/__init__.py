"""Autoregressive engines: vLLM (``vllm_engine``) and the torch reference (``torch_engine``)."""

from omni_serve.engines.ar.base import ARChunk, AREngine, ARRequest, SamplingConfig

__all__ = ["ARChunk", "AREngine", "ARRequest", "SamplingConfig"]
