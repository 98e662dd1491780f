from __future__ import annotations

from pathlib import Path

import openai
import pytest

from omni_serve.testing.serve_process import ServeProcess
from tests.integration.served_qwen3_omni import URL

PACKAGE = Path(__file__).parent


@pytest.fixture(scope="package")
def served():
    """`serve run graphs.qwen3_omni:app` from the repo root, for every module of the package."""
    with ServeProcess("graphs.qwen3_omni:app", URL) as server:
        yield server


@pytest.fixture(scope="package")
def client(served):
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused")


def pytest_collection_modifyitems(items):
    """The replica-death story kills the app's Code2wav replica: it runs after every other
    story of this package (which count on the replicas the app started with), and before any
    other package's tests, so that the app is still the one served."""
    here = [i for i, item in enumerate(items) if item.path.parent == PACKAGE]
    if not here:
        return
    ours = [items[i] for i in here]
    dying = [item for item in ours if item.path.name == "test_replica_death.py"]
    ordered = [item for item in ours if item not in dying] + dying
    for index, item in zip(here, ordered, strict=True):
        items[index] = item
