"""Audio is really encoded as asked; uploaded media is checked before it reaches a stage."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omni_serve.api.audio_codec import decode_audio, encode_audio
from omni_serve.api.media import MediaError, load_audio, load_image
from omni_serve.testing.media import wav_b64

RATE = 24000


def tone(seconds: float = 0.5, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize(("fmt", "container"), [("wav", "WAV"), ("flac", "FLAC"),
                                                ("mp3", "MP3"), ("opus", "OGG")])  # fmt: skip
def test_formats_are_real_files_of_that_kind(fmt, container):
    data = encode_audio(tone(), RATE, fmt)
    info = sf.info(io.BytesIO(data))
    assert info.format == container
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == (48000 if fmt == "opus" else RATE)
    assert abs(len(decoded) / rate - 0.5) < 0.06  # codecs pad a little


def test_pcm16_is_raw_little_endian_samples():
    samples = tone()
    raw = encode_audio(samples, RATE, "pcm16")
    assert len(raw) == 2 * len(samples)
    back = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767
    assert np.abs(back - samples).max() < 1e-4


def test_uploaded_audio_is_resampled_to_the_model_rate():
    samples = load_audio(wav_b64(tone(1.0, 44100), 44100), 16000, 10**7, 60, "p")
    assert abs(len(samples) - 16000) < 50
    assert decode_audio(base64.b64decode(wav_b64(tone(), RATE)), RATE).dtype == np.float32


@pytest.mark.parametrize(
    ("data", "max_bytes", "max_seconds", "message"),
    [
        ("%%%not base64", 10**7, 60, "not valid base64"),
        (base64.b64encode(b"RIFF....garbage").decode(), 10**7, 60, "could not decode audio"),
        (wav_b64(tone(1.0, 16000), 16000), 100, 60, "the limit is 100"),
        (wav_b64(tone(2.0, 16000), 16000), 10**7, 1.0, "the limit is 1.0 s"),
    ],
)
def test_bad_audio_is_a_media_error(data, max_bytes, max_seconds, message):
    with pytest.raises(MediaError, match=message) as err:
        load_audio(data, 16000, max_bytes, max_seconds, "messages[0].content[1]")
    assert err.value.param == "messages[0].content[1]"


def test_images_only_from_base64_data_urls():
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    assert load_image(url, False, "p").size == (8, 8)
    with pytest.raises(MediaError, match="only data: URLs"):
        load_image("https://example.invalid/cat.png", False, "p")
    with pytest.raises(MediaError, match="could not decode image"):
        load_image("data:image/png;base64," + base64.b64encode(b"nope").decode(), False, "p")
