"""The tiny Qwen3-Omni graph served once (``conftest.served``) for every module here, each
module one group of user stories."""

URL = "http://127.0.0.1:8000"


def chat_body(**extra) -> dict:
    body = {
        "model": "qwen3-omni",
        "messages": [{"role": "user", "content": "Tell me something."}],
        "max_tokens": 10,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "stage_overrides": {"talker": {"temperature": 0, "max_tokens": 60}},
    }
    body.update(extra)
    return body
