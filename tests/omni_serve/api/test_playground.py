"""The playground page: served at / with its files, open without the API key while what it
calls needs the key, and gone when ``api.playground`` is false."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from deployments.common import ingress_app
from omni_serve.api import access, playground
from omni_serve.config import ApiSettings


@pytest.fixture
def client():
    yield TestClient(ingress_app("test"))
    access.configure(None)
    playground.configure(False, "speech", "m")


def test_the_page_and_its_files_are_served_at_the_root(client):
    playground.configure(True, "speech", "qwen3-omni", ["ethan", "chelsie"])
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name in ("playground.js", "worklets.js", "playground.css"):
        assert f"/playground/{name}" in page.text or name == "worklets.js"
        response = client.get(f"/playground/{name}")
        assert response.status_code == 200 and len(response.content) > 100, name
    config = client.get("/playground/config.json").json()
    assert config == {"kind": "speech", "model": "qwen3-omni", "voices": ["chelsie", "ethan"]}


def test_with_a_key_the_page_is_open_and_its_config_is_not(client):
    playground.configure(True, "image", "qwen-image", sizes=["512x512"])
    access.configure("s3cret")
    assert client.get("/").status_code == 200
    assert client.get("/playground/playground.js").status_code == 200
    assert client.get("/playground/config.json").status_code == 401
    assert client.get("/playground/nothing.js").status_code == 401  # not a page file: guarded
    keyed = client.get("/playground/config.json", headers={"Authorization": "Bearer s3cret"})
    assert keyed.json() == {
        "kind": "image",
        "model": "qwen-image",
        "voices": [],
        "sizes": ["512x512"],
    }


def test_switched_off_the_page_is_a_404_that_says_why(client):
    playground.configure(False, "speech", "qwen3-omni")
    for path in ("/", "/playground/playground.js", "/playground/config.json"):
        response = client.get(path)
        assert response.status_code == 404
        assert "api.playground" in response.json()["error"]["message"]


def test_an_unknown_file_is_a_404_not_a_path_into_the_package(client):
    playground.configure(True, "speech", "qwen3-omni")
    assert client.get("/playground/__init__.py").status_code == 404
    assert client.get("/playground/..%2F..%2Fconfig%2Fpipeline.py").status_code == 404


def test_the_switch_is_on_by_default_and_documented():
    field = ApiSettings.model_fields["playground"]
    assert field.default is True and "production" in field.description
