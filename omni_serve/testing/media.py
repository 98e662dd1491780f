"""Media files for tests and benchmarks, made here (no sample files are downloaded)."""

from __future__ import annotations

import base64
import io
from typing import Any

import av
import numpy as np


def video_file(
    frames: np.ndarray, rate: int = 10, lossless: bool = False, audio: np.ndarray | None = None
) -> bytes:
    """A video of ``frames`` (uint8 [T, H, W, 3], even sides) at ``rate`` frames/s: MPEG-4 in
    mp4 as users send, or PNG frames in QuickTime (``lossless``: decodes to the same pixels,
    for comparing the served model with a reference run on the frames themselves). ``audio``
    (mono float32, 16 kHz): its sound track, AAC, or 16-bit PCM where ``lossless`` (decodes
    to the samples rounded to 16-bit steps)."""
    out = io.BytesIO()
    container_format, codec, pix_fmt = (
        ("mov", "png", "rgb24") if lossless else ("mp4", "mpeg4", "yuv420p")
    )
    with av.open(out, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = pix_fmt
        # Every stream is added before the first packet (which writes the header).
        track = (
            None
            if audio is None
            else container.add_stream("pcm_s16le" if lossless else "aac", rate=16000, layout="mono")
        )
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if track is not None:
            _mux_audio(container, track, audio)
    return out.getvalue()


def _mux_audio(container: Any, track: Any, samples: np.ndarray, rate: int = 16000) -> None:
    pcm = np.round(np.clip(samples, -1, 1 - 1 / 32768) * 32768).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
    frame.sample_rate, frame.pts = rate, 0
    for resampled in av.AudioResampler(track.format.name, "mono", rate).resample(frame):
        container.mux(track.encode(resampled))
    container.mux(track.encode())


def video_data_url(
    frames: np.ndarray, rate: int = 10, lossless: bool = False, audio: np.ndarray | None = None
) -> str:
    """``video_file`` as the data: URL a ``video_url`` content part carries."""
    kind = "quicktime" if lossless else "mp4"
    raw = video_file(frames, rate, lossless, audio)
    return f"data:video/{kind};base64," + base64.b64encode(raw).decode()


def gray_frames(count: int, height: int = 64, width: int = 96, step: int = 10) -> np.ndarray:
    """Frame i is uniform gray ``i * step``: a sampled frame's mean names which it was."""
    levels = (np.arange(count) * step).clip(0, 255).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, height, width, 3)).copy()


def wav_b64(samples: np.ndarray, rate: int, subtype: str | None = None) -> str:
    """``samples`` as the base64 WAV an ``input_audio`` part carries (``subtype="FLOAT"``:
    lossless for float samples)."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return base64.b64encode(buf.getvalue()).decode()


def png_data_url(image: Any) -> str:  # a PIL image
    """A PIL image as the (lossless) data: URL an ``image_url`` part carries."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
