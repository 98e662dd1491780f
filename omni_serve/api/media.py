"""Turning request content parts into media: base64 audio, data-URL images (video: video.py)."""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from omni_serve.api.audio_codec import AudioDecodeError, decode_audio


class MediaError(ValueError):
    """Bad media in a request: becomes a 400 with this message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _b64(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("not valid base64", param) from None


def load_audio(data_b64: str, sample_rate: int, max_bytes: int, max_seconds: float,
               param: str) -> np.ndarray:  # fmt: skip
    raw = _b64(data_b64, param)
    if len(raw) > max_bytes:
        raise MediaError(f"audio is {len(raw)} bytes; the limit is {max_bytes}", param)
    try:
        samples = decode_audio(raw, sample_rate)
    except AudioDecodeError as exc:
        raise MediaError(str(exc), param) from None
    seconds = len(samples) / sample_rate
    if seconds > max_seconds:
        raise MediaError(f"audio is {seconds:.1f} s long; the limit is {max_seconds} s", param)
    if len(samples) == 0:
        raise MediaError("audio is empty", param)
    return samples


def data_url_bytes(url: str, allow_remote: bool, kind: str, param: str) -> bytes:
    """The bytes of a base64 ``data:`` URL (what image and video parts carry)."""
    if not url.startswith("data:"):
        if not allow_remote:
            raise MediaError(f"only data: URLs are accepted for {kind}s", param)
        raise MediaError(f"remote {kind} URLs are not supported yet", param)
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise MediaError(f"{kind} data URL must be base64", param)
    return _b64(payload, param)


def load_image(url: str, allow_remote: bool, param: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data_url_bytes(url, allow_remote, "image", param)))
        image.load()
    except (UnidentifiedImageError, OSError):
        raise MediaError("could not decode image", param) from None
    return image.convert("RGB")
