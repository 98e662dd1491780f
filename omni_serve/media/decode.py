"""Turning request content parts into media: base64 audio, images (video: video.py; remote
URLs: media_fetch.py)."""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping

import numpy as np
from PIL import Image, UnidentifiedImageError

from omni_serve.media.audio_codec import AudioDecodeError, decode_audio


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


def input_audio_bytes(data_b64: str, max_bytes: int, param: str) -> bytes:
    """The file an ``input_audio`` part carries (base64)."""
    raw = _b64(data_b64, param)
    if len(raw) > max_bytes:
        raise MediaError(f"audio is {len(raw)} bytes; the limit is {max_bytes}", param)
    return raw


# The ``input_audio.format`` each libsndfile container is.
_FORMATS = {"WAV": "wav", "WAVEX": "wav", "RF64": "wav", "MP3": "mp3", "FLAC": "flac", "OGG": "ogg"}


def audio_header(raw: bytes) -> tuple[str | None, float | None]:
    """The ``input_audio.format`` the bytes are and their length in seconds (the header's
    count); ``(None, None)`` when libsndfile reads none of them."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(raw))
    except Exception:  # libsndfile raises several types for what it cannot read
        return None, None
    return _FORMATS.get(info.format), info.duration


def audio_format(raw: bytes) -> str | None:
    """The ``input_audio.format`` the bytes are, ``None`` when libsndfile reads none of them."""
    return audio_header(raw)[0]


def check_container(raw: bytes, fmt: str, param: str) -> None:
    """A 400 when the bytes are not the container ``fmt`` names: a client that declares one
    format and sends another has a bug to hear about, even where the bytes happen to decode.
    Bytes of no known container pass here, for ``load_audio`` to say why they do not decode."""
    found = audio_format(raw)
    if found is not None and found != fmt:
        message = f"format is {fmt!r} but the data is a {found} file"
        raise MediaError(message, f"{param}.format")


def load_audio(
    raw: bytes, sample_rate: int, max_seconds: float, param: str, min_samples: int = 1
) -> np.ndarray:
    """Mono float32 at ``sample_rate`` from an audio file; ``min_samples``: the fewest the
    model's features can be made of."""
    try:
        samples = decode_audio(raw, sample_rate)
    except AudioDecodeError as exc:
        raise MediaError(str(exc), param) from None
    seconds = len(samples) / sample_rate
    if seconds > max_seconds:
        raise MediaError(f"audio is {seconds:.1f} s long; the limit is {max_seconds} s", param)
    check_long_enough(samples, sample_rate, min_samples, param)
    return samples


def check_long_enough(
    samples: np.ndarray, sample_rate: int, min_samples: int, param: str, what: str = "audio"
) -> None:
    """A 400 for audio the model's features cannot be made of (its STFT needs a window)."""
    if len(samples) == 0:
        raise MediaError(f"{what} is empty", param)
    if len(samples) < min_samples:
        shortest = f"{min_samples} ({min_samples / sample_rate * 1000:.1f} ms)"
        message = f"{what} is {len(samples)} samples; the shortest the model takes is {shortest}"
        raise MediaError(message, param)


def url_bytes(
    url: str, fetched: Mapping[str, bytes], kind: str, max_bytes: int, param: str
) -> bytes:
    """The file a URL part (audio, image, video) names: a base64 ``data:`` URL's bytes, or a remote
    URL's as ``media_fetch`` fetched them (``fetched``: empty where the server fetches none)."""
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if ";base64" not in header:
            raise MediaError(f"{kind} data URL must be base64", param)
        raw = _b64(payload, param)
    elif url in fetched:
        raw = fetched[url]
    else:
        raise MediaError(
            f"only data: URLs are accepted for {kind}s: this server does not fetch "
            "remote URLs (api.allow_remote_urls)",
            param,
        )
    if len(raw) > max_bytes:
        raise MediaError(f"{kind} is {len(raw)} bytes; the limit is {max_bytes}", param)
    return raw


def load_image(raw: bytes, max_pixels: int, param: str) -> Image.Image:
    """The image in RGB. Its size is read from the header and checked before its pixels are
    decoded: a few hundred KB of PNG can hold a gigabyte of pixels."""
    try:
        image = Image.open(io.BytesIO(raw))
        width, height = image.size
        if width * height > max_pixels:
            raise MediaError(
                f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}",
                param,
            )
        image.load()
    except Image.DecompressionBombError:  # PIL's own limit, past twice MAX_IMAGE_PIXELS
        raise MediaError(f"image has more than {max_pixels} pixels", param) from None
    except (UnidentifiedImageError, OSError):
        raise MediaError("could not decode image", param) from None
    return image.convert("RGB")
