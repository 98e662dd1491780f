"""One line of a batch input file, in the OpenAI Batch API request format, and what its
response becomes on disk.

A line is ``{"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``.
The custom id names the output files, so it is restricted to characters that cannot leave the
output directory (no separators, no leading dot).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

CUSTOM_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENDPOINTS = ("/v1/chat/completions", "/v1/audio/speech", "/v1/images/generations")
AUDIO_SUFFIXES = {"pcm16": "pcm", "pcm": "pcm", "opus": "ogg"}


class LineError(ValueError):
    """A line the job cannot send; reported in the manifest, the job goes on."""


@dataclass(frozen=True)
class BatchItem:
    line: int  # 1-based line number in the input file
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_line(line: int, text: str) -> BatchItem:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LineError(f"not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise LineError("a line must be a JSON object")
    custom_id, url, body = record.get("custom_id"), record.get("url"), record.get("body")
    if custom_id is None:
        raise LineError("custom_id is missing (it names the output files)")
    if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
        raise LineError(
            f"custom_id {custom_id!r}: must be 1-128 of [A-Za-z0-9._-], starting with a letter "
            "or digit (it names the output files)"
        )
    if record.get("method", "POST") != "POST":
        raise LineError(f"method {record['method']!r}: only POST is supported")
    if url not in ENDPOINTS:
        raise LineError(f"url {url!r}: must be one of {list(ENDPOINTS)}")
    if not isinstance(body, dict):
        raise LineError("body: must be a JSON object (the request body)")
    return BatchItem(line, custom_id, url, _whole_response(url, body))


def _whole_response(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The job writes whole files, so it asks for whole (not streamed) responses."""
    body = dict(body)
    body.pop("stream", None)
    if url == "/v1/audio/speech":
        body.pop("stream_format", None)
    return body


def response_files(item: BatchItem, content: bytes) -> dict[str, bytes]:
    """The files a successful response becomes: ``{file name: bytes}``."""
    if item.url == "/v1/audio/speech":
        fmt = item.body.get("response_format", "wav")
        return {f"{item.custom_id}.{AUDIO_SUFFIXES.get(fmt, fmt)}": content}
    response = json.loads(content)
    if item.url == "/v1/images/generations":
        return _numbered(
            item.custom_id, "png", [base64.b64decode(d["b64_json"]) for d in response["data"]]
        )
    message = response["choices"][0]["message"]
    files: dict[str, bytes] = {}
    content_field = message.get("content")
    if isinstance(content_field, str):
        files[f"{item.custom_id}.txt"] = content_field.encode()
    elif isinstance(content_field, list):  # image parts (image models answer with data URLs)
        images = [
            _data_url_bytes(p["image_url"]["url"])
            for p in content_field
            if p.get("type") == "image_url"
        ]
        files.update(_numbered(item.custom_id, "png", images))
    if message.get("audio"):
        fmt = (item.body.get("audio") or {}).get("format", "wav")
        files[f"{item.custom_id}.{AUDIO_SUFFIXES.get(fmt, fmt)}"] = base64.b64decode(
            message["audio"]["data"]
        )
    return files


def _numbered(stem: str, suffix: str, blobs: list[bytes]) -> dict[str, bytes]:
    if len(blobs) == 1:
        return {f"{stem}.{suffix}": blobs[0]}
    return {f"{stem}-{i}.{suffix}": blob for i, blob in enumerate(blobs)}


def _data_url_bytes(url: str) -> bytes:
    _, _, data = url.partition(";base64,")
    return base64.b64decode(data)
