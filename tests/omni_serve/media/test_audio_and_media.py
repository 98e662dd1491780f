"""Audio is really encoded as asked; uploaded media is checked before it reaches a stage."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omni_serve.media.audio_codec import AudioDecodeError, decode_audio, encode_audio
from omni_serve.media.decode import (
    MediaError,
    audio_header,
    input_audio_bytes,
    load_audio,
    load_image,
    url_bytes,
)
from omni_serve.testing.media import wav_b64

RATE = 24000


def tone(seconds: float = 0.5, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize(
    ("fmt", "container"), [("wav", "WAV"), ("flac", "FLAC"), ("mp3", "MP3"), ("opus", "OGG")]
)
def test_formats_are_real_files_of_that_kind(fmt, container):
    data = encode_audio(tone(), RATE, fmt)
    info = sf.info(io.BytesIO(data))
    assert info.format == container
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == (48000 if fmt == "opus" else RATE)
    assert abs(len(decoded) / rate - 0.5) < 0.06  # codecs pad a little
    found, seconds = audio_header(data)
    assert found == ("ogg" if fmt == "opus" else fmt) and abs(seconds - 0.5) < 0.06


def test_audio_header_is_none_for_what_no_decoder_reads():
    assert audio_header(b"RIFF nonsense") == (None, None)


def test_pcm16_is_raw_little_endian_samples():
    samples = tone()
    raw = encode_audio(samples, RATE, "pcm16")
    assert len(raw) == 2 * len(samples)
    back = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767
    assert np.abs(back - samples).max() < 1e-4


def test_uploaded_audio_is_resampled_to_the_model_rate():
    samples = load_audio(base64.b64decode(wav_b64(tone(1.0, 44100), 44100)), 16000, 60, "p")
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
    """As an input_audio part's base64 goes: its bytes checked, then its samples."""
    param = "messages[0].content[1]"
    with pytest.raises(MediaError, match=message) as err:
        load_audio(input_audio_bytes(data, max_bytes, param), 16000, max_seconds, param)
    assert err.value.param == param


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, format="PNG")
    return buf.getvalue()


def test_images_from_data_urls_or_fetched_files_only():
    url = "data:image/png;base64," + base64.b64encode(png(8, 8)).decode()
    raw = url_bytes(url, {}, "image", 1 << 20, "p")
    assert load_image(raw, 10**6, "p").size == (8, 8)
    remote = "https://example.invalid/cat.png"
    assert url_bytes(remote, {remote: b"png"}, "image", 1 << 20, "p") == b"png"
    with pytest.raises(MediaError, match="only data: URLs.*allow_remote_urls"):
        url_bytes(remote, {}, "image", 1 << 20, "p")
    with pytest.raises(MediaError, match="the limit is 10$"):
        url_bytes(url, {}, "image", 10, "p")
    with pytest.raises(MediaError, match="could not decode image"):
        load_image(b"nope", 10**6, "p")


@pytest.mark.parametrize("side", [2000, 20000])  # under, and past twice, PIL's own bomb limit
def test_an_image_over_the_pixel_limit_is_refused_before_it_decodes(side):
    raw = png(side, side, mode="1")  # 1-bit: a small file of many pixels
    assert len(raw) < 2 << 20
    with pytest.raises(MediaError, match="pixels") as caught:
        load_image(raw, 1_000_000, "messages[0].content[2]")
    assert caught.value.param == "messages[0].content[2]"


def test_undecodable_audio_gives_libsndfiles_reason_not_the_in_memory_files_name():
    with pytest.raises(AudioDecodeError) as err:
        decode_audio(b"not audio at all", RATE)
    assert str(err.value) == "could not decode audio: Format not recognised."


def test_pcm16_wav_and_flac_hold_the_same_samples():
    """So a streamed pcm16 reply equals a non-streamed wav or flac one, sample for sample."""
    samples = np.random.default_rng(0).uniform(-1.2, 1.2, 24_000).astype(np.float32)
    pcm = np.frombuffer(encode_audio(samples, 24_000, "pcm16"), "<i2")
    for fmt in ("wav", "flac"):
        decoded, _ = sf.read(io.BytesIO(encode_audio(samples, 24_000, fmt)), dtype="int16")
        assert np.array_equal(decoded, pcm), fmt
