"""A stage at capacity or a dead replica is a 503 with Retry-After (retry later); input a stage
rejected a 400 with its reason; any other stage failure a 500."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from omni_serve.api.errors import (
    ApiError,
    ReplicaDied,
    StageRejectedInput,
    StageUnavailable,
    check_model,
    install_error_handlers,
    stage_failure,
)


def test_a_full_stage_is_a_503_with_retry_after_rounded_up():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/busy")
    def busy():
        raise stage_failure(StageUnavailable("server busy: queue full", retry_after_s=1.2))

    response = TestClient(app).get("/busy")
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json()["error"] == {
        "message": "server busy: queue full",
        "type": "server_error",
        "param": None,
        "code": "overloaded",
    }


def test_other_stage_failures_are_a_500_naming_the_error():
    error = stage_failure(RuntimeError("engine died"))
    assert error.status == 500 and error.headers is None
    assert error.body["error"]["message"] == "generation failed: RuntimeError: engine died"


def test_a_dead_replica_is_a_503_naming_the_stage():
    error = stage_failure(ReplicaDied("talker"))
    assert error.status == 503 and error.headers == {"Retry-After": "5"}
    assert error.body["error"]["code"] == "replica_died"
    assert "stage 'talker' died" in error.message and "send the request again" in error.message


def test_input_a_stage_rejected_is_a_400_with_its_reason_also_through_ray():
    from ray.exceptions import RayTaskError

    try:
        raise StageRejectedInput("prompt of 5741 tokens, context 4096")
    except StageRejectedInput as exc:
        remote = RayTaskError("generate", "traceback", exc).as_instanceof_cause()
    for error in (StageRejectedInput("prompt of 5741 tokens, context 4096"), remote):
        failure = stage_failure(error)
        assert failure.status == 400
        assert failure.body["error"]["message"] == "prompt of 5741 tokens, context 4096"
        assert failure.body["error"]["type"] == "invalid_request_error"


class _Named(BaseModel):
    name: str


def _echo_app() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    def echo(body: _Named):
        return {"name": body.name}

    return TestClient(app)


def test_a_body_not_sent_as_json_is_a_415_naming_its_content_type():
    client = _echo_app()
    payload = b'{"name": "x"}'
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):
        response = client.post("/echo", content=payload, headers={"content-type": content_type})
        assert response.status_code == 415, content_type
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert "application/json" in error["message"] and repr(content_type) in error["message"]
    # No content type at all: not parsed either (FastAPI's guard against cross-site posts).
    response = client.post("/echo", content=payload)
    assert response.status_code == 415
    assert "this request sent none" in response.json()["error"]["message"]


def test_json_content_types_are_parsed_and_a_json_body_of_the_wrong_shape_stays_a_400():
    client = _echo_app()
    payload = b'{"name": "x"}'
    for headers in (
        {"content-type": "application/json; charset=utf-8"},
        {"content-type": "application/vnd.api+json"},
    ):
        response = client.post("/echo", content=payload, headers=headers)
        assert response.status_code == 200 and response.json() == {"name": "x"}, headers
    response = client.post("/echo", json=["x"])
    assert response.status_code == 400
    assert (
        response.json()["error"]["message"]
        == "Input should be a valid dictionary or object to extract fields from"
    )


def test_no_such_route_and_a_wrong_method_get_the_error_shape_naming_what_there_is():
    client = _echo_app()
    missing = client.post("/v1/images/generations", json={})
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["code"] == "not_found"
    assert error["message"] == (
        "no route POST /v1/images/generations on this server; it has POST /echo"
    )
    wrong = client.get("/echo")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"] == {
        "message": "/echo takes POST, not GET",
        "type": "invalid_request_error",
        "param": None,
        "code": "method_not_allowed",
    }


def test_a_request_for_another_model_is_a_404_naming_the_served_one():
    check_model("qwen3-omni", "qwen3-omni")
    check_model(None, "qwen3-omni")  # no model named: the served one
    with pytest.raises(ApiError) as refused:
        check_model("gpt-4o", "qwen3-omni")
    assert refused.value.status == 404 and refused.value.body["error"] == {
        "message": "model 'gpt-4o' does not exist; this server serves 'qwen3-omni'",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_a_bug_is_a_500_in_the_error_shape_not_plain_text():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    def bug():
        raise TypeError("'NoneType' object is not iterable")

    response = TestClient(app, raise_server_exceptions=False).get("/bug")
    assert response.status_code == 500
    assert response.json()["error"] == {
        "message": "internal error: TypeError: 'NoneType' object is not iterable",
        "type": "server_error",
        "param": None,
        "code": None,
    }
