from __future__ import annotations

import openai
import pytest

from omni_serve.testing.serve_process import ServeProcess
from tests.integration.served_qwen3_omni import URL


@pytest.fixture(scope="package")
def served():
    """`serve run graphs.qwen3_omni:app` from the repo root, for every module of the package."""
    with ServeProcess("graphs.qwen3_omni:app", URL) as server:
        yield server


@pytest.fixture(scope="package")
def client(served):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")
