"""Request bodies over api.max_request_bytes get a 413 before anything parses them, whether
they declare their length or arrive chunked; bodies within the limit pass untouched."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from omni_serve.api import body_limit


@pytest.fixture
def client():
    app = FastAPI()
    app.add_middleware(body_limit.BodyLimitMiddleware)

    @app.post("/echo")
    async def echo(request: Request):
        return {"bytes": len(await request.body())}

    body_limit.configure(1000)
    yield TestClient(app)
    body_limit.configure(None)


def test_a_declared_oversized_body_is_a_413(client):
    response = client.post("/echo", content=b"x" * 1001)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_chunked_oversized_body_is_a_413(client):
    def chunks():
        for _ in range(20):
            yield b"x" * 100

    assert client.post("/echo", content=chunks()).status_code == 413


def test_bodies_within_the_limit_arrive_whole(client):
    def chunks():
        for _ in range(9):
            yield b"x" * 100

    assert client.post("/echo", content=chunks()).json() == {"bytes": 900}
    assert client.post("/echo", content=b"y" * 1000).json() == {"bytes": 1000}
