"""A malformed body is answered with the field the client got wrong, written as OpenAI writes
it, not with the first branch of a union pydantic tried."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from omni_serve.api.errors import install_error_handlers
from omni_serve.api.protocol import ChatCompletionRequest
from omni_serve.api.validation_errors import FieldError, field_path, most_specific


def test_branch_labels_leave_the_path_and_indexes_are_bracketed():
    loc = ("messages", 0, "content", "list[tagged-union[TextPart,AudioPart]]", 0, "AudioPart")
    assert field_path((*loc, "input_audio", "format")) == (
        "messages[0].content[0].input_audio.format"
    )
    assert field_path(("messages", 0, "content", "str")) == "messages[0].content"
    assert field_path(()) == ""


def test_the_deepest_error_wins_and_the_first_of_equals():
    errors = [
        {"loc": ("a", "str"), "msg": "shallow"},
        {"loc": ("a", "list[int]", 0), "msg": "first deep"},
        {"loc": ("a", "list[str]", 1), "msg": "second deep"},
    ]
    assert most_specific(errors) == FieldError("a[0]", "first deep")
    assert most_specific(errors[:1], skip=1) == FieldError(None, "shallow")
    assert FieldError(None, "bad").message == "bad"
    assert FieldError("x", "bad").under("input_audio") == FieldError("input_audio.x", "bad")


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/chat/completions")
    def chat(body: ChatCompletionRequest) -> dict:
        return {"ok": True}

    return TestClient(app)


def _error(client: TestClient, content) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_an_audio_format_not_taken_names_input_audio_format(client):
    part = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "aiff"}}
    error = _error(client, [part])
    assert error["param"] == "messages[0].content[0].input_audio.format"
    assert error["message"] == (
        "messages[0].content[0].input_audio.format: Input should be 'wav', 'mp3', 'flac' or 'ogg'"
    )


def test_a_part_is_judged_as_the_kind_its_type_says(client):
    error = _error(client, [{"type": "text", "text": "hi"}, {"type": "image_url", "url": "x"}])
    assert error["param"] == "messages[0].content[1].image_url"
    assert error["message"].endswith("Field required")
    error = _error(client, [{"type": "audio", "data": "x"}])
    assert error["param"] == "messages[0].content[0]"
    assert "'text', 'input_audio', 'audio_url', 'image_url', 'video_url'" in error["message"]


def test_a_validators_own_reason_is_the_message_without_pydantics_prefix():
    errors = [{"loc": ("body", "prompt"), "msg": "Value error, prompt must not be empty"}]
    assert most_specific(errors, skip=1).message == "prompt: prompt must not be empty"


def test_a_plain_string_and_every_part_kind_still_validate():
    parts = [
        {"type": "text", "text": "hi"},
        {"type": "input_audio", "input_audio": {"data": "x", "format": "mp3"}},
        {"type": "audio_url", "audio_url": {"url": "data:,"}},
        {"type": "image_url", "image_url": {"url": "data:,"}},
        {"type": "video_url", "video_url": {"url": "data:,"}},
    ]
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    assert ChatCompletionRequest.model_validate(body).messages[0].content == "hello"
    body["messages"][0]["content"] = parts
    message = ChatCompletionRequest.model_validate(body).messages[0]
    assert [p.type for p in message.content] == [p["type"] for p in parts]


def test_an_empty_audio_id_is_a_400_naming_it(client):
    """Found by the fuzzer: an assistant message of ``audio: {"id": ""}`` alone passed as a
    message without content, and its prompt failed in the ingress (a 500)."""
    body = {"model": "m", "messages": [{"role": "assistant", "audio": {"id": ""}}]}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].audio.id"
