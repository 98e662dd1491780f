from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
async def vllm_thinker(tiny_omni_path):
    """One vLLM Thinker engine (with hidden-state capture) for the whole integration session."""
    from omni_serve.engines.ar.vllm_engine import VLLMEngine

    engine = VLLMEngine(str(tiny_omni_path), capture_hidden=True)
    await engine.start()
    yield engine
    await engine.shutdown()
