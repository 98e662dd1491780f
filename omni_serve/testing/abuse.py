"""Checks the abuse tests run against a served app: fuzzing its OpenAPI spec, waiting on it.

Shared by the operations tests of every graph (tests/integration/test_operations*.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str) -> T:
    """The first truthy value of ``predicate()``, polled every 0.5 s; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def send_while_killing(
    send: Callable[[], T], pid: int, seconds: float, clients: int = 2, kill_after_s: float = 2.0
) -> list[T]:
    """``clients`` threads call ``send()`` back to back for ``seconds``; the process ``pid`` (a
    replica) is killed with SIGKILL ``kill_after_s`` in. Returns every answer."""
    stop = time.monotonic() + seconds
    answers: list[T] = []

    def client() -> None:
        while time.monotonic() < stop:
            answers.append(send())

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        running = [pool.submit(client) for _ in range(clients)]
        time.sleep(kill_after_s)
        os.kill(pid, signal.SIGKILL)
        for future in running:
            future.result()
    return answers


def fuzz_without_server_errors(
    base_url: str,
    headers: dict[str, str] | None = None,
    examples: int = 25,
    body_fields: dict[str, object] | None = None,
) -> set[str]:
    """Schemathesis builds requests from the app's own OpenAPI spec (valid and invalid bodies,
    odd types and sizes), ``examples`` per operation. Every answer must be below 500, a 503
    with Retry-After (backpressure), or the 504 of a request that asked for a tiny
    ``timeout_s``. Returns the paths fuzzed, so callers can check the spec covers their API.

    ``body_fields`` are set in every JSON-object body (e.g. the served model's name: a random
    one is a 404 before any stage runs, so without it few cases would reach the stages)."""
    import schemathesis  # a dev dependency: only the tests fuzz
    from hypothesis import HealthCheck, given, settings

    headers = headers or {}
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def answers_without_a_server_error(case: Any) -> None:
            if body_fields and isinstance(case.body, dict):
                case.body.update(body_fields)
            response = case.call(headers=headers, timeout=120)
            if response.status_code == 503:
                assert "retry-after" in response.headers, response.text[:300]
            elif response.status_code == 504:  # the fuzzer asked for a tiny timeout_s
                assert isinstance(case.body, dict) and case.body.get("timeout_s"), response.text
                assert response.json()["error"]["type"] == "timeout_error"
            else:
                where = (case.method, case.path, case.body)
                assert response.status_code < 500, (where, response.status_code, response.text)

        answers_without_a_server_error()
    return {operation.path for operation in operations}
