"""Video parts: frames sampled at the API's rate, bounded in bytes, seconds and pixels, and any
bad upload a 400-worthy MediaError naming the part."""

from __future__ import annotations

import base64
import io
from fractions import Fraction

import av
import numpy as np
import pytest
import soundfile as sf

from omni_serve.media.decode import MediaError, url_bytes
from omni_serve.media.video import load_video, load_video_audio
from omni_serve.testing.media import gray_frames, video_data_url, video_file

LIMITS = {"max_seconds": 10.0, "fps": 2.0, "max_pixels": 1 << 20}
PARAM = "messages[0].content[0]"


def load(url: str, max_bytes: int = 1 << 20, **limits) -> np.ndarray:
    """A video part's frames, as the ingress gets them from its URL."""
    raw = url_bytes(url, {}, "video", max_bytes, PARAM)
    return load_video(raw, PARAM, **{**LIMITS, **limits})


def data_url(raw: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(raw).decode()


def test_frames_are_taken_at_the_api_rate():
    """25 frames at 10 fps (2.5 s) sampled at 2 fps: the frames at 0, 0.5, ... 2.0 s."""
    frames = load(video_data_url(gray_frames(25, step=10), rate=10))
    assert frames.shape == (5, 64, 96, 3) and frames.dtype == np.uint8
    means = frames.reshape(5, -1).mean(axis=1)
    assert np.allclose(means, [0, 50, 100, 150, 200], atol=4), means


def test_a_rate_above_the_videos_takes_every_frame():
    assert load(video_data_url(gray_frames(6), rate=5), fps=10.0).shape[0] == 6


def test_large_frames_are_scaled_to_the_pixel_limit_keeping_the_aspect():
    frames = load(video_data_url(gray_frames(2, height=240, width=320)), max_pixels=100 * 100)
    _, height, width, _ = frames.shape
    assert height * width <= 100 * 100 and abs(width / height - 320 / 240) < 0.05


@pytest.mark.parametrize(
    ("url", "limits", "reason"),
    [
        (video_data_url(gray_frames(30), rate=10), {"max_seconds": 2.0}, "longer than the limit"),
        (video_data_url(gray_frames(4)), {"max_bytes": 100}, "the limit is 100"),
        (data_url(b"\x00not a video" * 50), {}, "could not decode video"),
        ("data:video/mp4;base64,@@@", {}, "not valid base64"),
        ("data:video/mp4,raw", {}, "must be base64"),
        ("https://example.com/a.mp4", {}, "only data: URLs"),
    ],
)
def test_bad_videos_are_refused_with_the_reason(url, limits, reason):
    with pytest.raises(MediaError, match=reason) as caught:
        load(url, **limits)
    assert caught.value.param == PARAM


def test_a_file_without_a_video_stream_is_refused():
    wav = io.BytesIO()
    sf.write(wav, np.zeros(1600, np.float32), 16000, format="WAV")
    with pytest.raises(MediaError, match="no video stream"):
        load(data_url(wav.getvalue()))


def test_the_test_encoder_makes_a_real_mp4():
    assert video_file(gray_frames(2))[4:8] == b"ftyp"


def test_a_lossless_file_decodes_to_the_same_frames():
    frames = np.random.default_rng(0).integers(0, 256, (5, 64, 96, 3), np.uint8)
    assert np.array_equal(load(video_data_url(frames, rate=2, lossless=True)), frames)


def mpeg_ts(frames: np.ndarray, first_pts: int) -> bytes:
    """MPEG-TS at 2 frames/s: two of them back to back are one stream whose frame size changes
    where the second begins (as a recorded adaptive stream's does)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mpegts") as container:
        stream = container.add_stream("mpeg2video", rate=2)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt, stream.time_base = "yuv420p", Fraction(1, 2)
        for pts, frame in enumerate(frames, start=first_pts):
            picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
            picture.pts, picture.time_base = pts, Fraction(1, 2)
            container.mux(stream.encode(picture))
        container.mux(stream.encode())
    return out.getvalue()


def test_frames_after_a_mid_stream_size_change_take_the_first_frames_size():
    raw = mpeg_ts(gray_frames(4, 64, 96), 0) + mpeg_ts(gray_frames(4, 32, 48, step=60), 4)
    frames = load(data_url(raw))
    assert frames.shape[1:] == (64, 96, 3) and len(frames) >= 6
    assert abs(frames[-1].mean() - 180) < 6  # the second part's last frame, scaled up


def test_a_videos_pcm_track_decodes_to_its_samples():
    tone = (np.round(np.sin(np.arange(16000) / 9) * 0.4 * 32768) / 32768).astype(np.float32)
    raw = video_file(gray_frames(4), rate=2, lossless=True, audio=tone)
    assert np.array_equal(load_video_audio(raw, 16000, PARAM, max_seconds=10.0), tone)
    assert load_video_audio(raw, 8000, PARAM, max_seconds=10.0).shape == (8000,)  # resampled


@pytest.mark.parametrize(
    ("raw", "max_seconds", "reason"),
    [
        (video_file(gray_frames(4)), 10.0, "has no audio track"),
        (video_file(gray_frames(4), audio=np.zeros(16000 * 5, np.float32)), 2.0, "longer than"),
        (b"\x00not a video" * 50, 10.0, "could not decode the video's audio track"),
    ],
)
def test_bad_tracks_are_refused_with_the_reason(raw, max_seconds, reason):
    with pytest.raises(MediaError, match=reason) as caught:
        load_video_audio(raw, 16000, PARAM, max_seconds=max_seconds)
    assert caught.value.param == PARAM
