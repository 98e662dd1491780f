"""Encoding PCM to the response formats and decoding uploaded audio (soundfile/libsndfile)."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

_SOUNDFILE_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", None)}


class AudioDecodeError(ValueError):
    """An uploaded audio file that cannot be read."""


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str, speed: float = 1.0) -> bytes:
    """``samples`` in ``fmt``, played ``speed`` times as fast. A whole reply in mp3 or opus
    costs 5-12 ms of CPU per second of audio: an ingress calls it in a worker thread (its
    event loop writes every other client's stream), streamed pcm16 chunks on the loop."""
    samples = np.clip(np.asarray(change_speed(samples, speed, sample_rate), np.float32), -1, 1)
    if fmt in ("pcm16", "flac"):
        # Float to 16 bits once, by libsndfile's WAV conversion, so pcm16, wav and flac hold
        # the same samples (its FLAC writer rounds floats differently, by 1 LSB)
        buf = io.BytesIO()
        sf.write(buf, samples, sample_rate, format="RAW", subtype="PCM_16", endian="LITTLE")
        if fmt == "pcm16":
            return buf.getvalue()
        buf, pcm = io.BytesIO(), np.frombuffer(buf.getvalue(), "<i2")
        sf.write(buf, pcm, sample_rate, format="FLAC", subtype="PCM_16")
        return buf.getvalue()
    if fmt == "opus":
        import soxr

        buf = io.BytesIO()  # libsndfile's Opus needs 48 kHz
        sf.write(
            buf, soxr.resample(samples, sample_rate, 48000), 48000, format="OGG", subtype="OPUS"
        )
        return buf.getvalue()
    container, subtype = _SOUNDFILE_FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, samples, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


def decode_audio(data: bytes, target_rate: int) -> np.ndarray:
    """Mono float32 at ``target_rate`` from any file libsndfile reads."""
    import soxr

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # libsndfile raises several types for corrupt input
        # soundfile names the in-memory file it opened ("Error opening <_io.BytesIO object at
        # 0x...>: Format not recognised."): only libsndfile's reason is the client's business.
        reason = str(exc).rpartition(">: ")[2] or type(exc).__name__
        raise AudioDecodeError(f"could not decode audio: {reason}") from None
    mono = samples.mean(axis=1)
    if rate != target_rate:
        mono = soxr.resample(mono, rate, target_rate).astype(np.float32)
    return mono


STREAMABLE_FORMATS = ("pcm16", "wav")


def wav_stream_header(sample_rate: int, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV header for a stream of unknown length (sizes set to 0xFFFFFFFF, which
    players and soundfile read as 'until the end of the data')."""
    import struct

    block = channels * 2
    fmt = struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
    unknown = struct.pack("<I", 0xFFFFFFFF)
    return b"RIFF" + unknown + b"WAVE" + b"fmt " + fmt + b"data" + unknown


def change_speed(samples: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """Playback speed by resampling (tempo and pitch change together)."""
    if speed == 1.0:
        return samples
    import soxr

    return soxr.resample(samples, sample_rate * speed, sample_rate).astype(np.float32)
