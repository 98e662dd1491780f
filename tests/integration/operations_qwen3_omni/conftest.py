"""One app (the tiny graph from tests/integration/pipelines/qwen3_omni_ops.yaml) serves every
story in this package; ``test_stop.py`` stops it, so it runs last."""

from __future__ import annotations

import pytest

from omni_serve.testing.ray_metrics import QUICK_REPORTS
from omni_serve.testing.serve_process import ServeProcess
from tests.integration.operations_qwen3_omni.app import URL


@pytest.fixture(scope="package")
def served():
    config = "pipeline_config=tests/integration/pipelines/qwen3_omni_ops.yaml"
    app = ServeProcess("graphs.qwen3_omni:build_app", URL, args=(config,), env=QUICK_REPORTS)
    with app as server:
        yield server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The story that stops the app goes after every other story of this package."""
    stops = [item for item in items if "operations_qwen3_omni/test_stop.py" in item.nodeid]
    ours = [i for i, item in enumerate(items) if "operations_qwen3_omni/" in item.nodeid]
    if not stops or not ours:
        return
    for item in stops:
        items.remove(item)
    last = max(i for i, item in enumerate(items) if "operations_qwen3_omni/" in item.nodeid)
    items[last + 1 : last + 1] = stops
