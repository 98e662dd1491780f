"""Media files for tests and benchmarks, made here (no sample files are downloaded)."""

from __future__ import annotations

import base64
import io

import av
import numpy as np


def mp4_bytes(frames: np.ndarray, rate: int = 10) -> bytes:
    """An MPEG-4 video of ``frames`` (uint8 [T, H, W, 3], even sides) at ``rate`` frames/s."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return out.getvalue()


def mp4_data_url(frames: np.ndarray, rate: int = 10) -> str:
    """``mp4_bytes`` as the data: URL a ``video_url`` content part carries."""
    return "data:video/mp4;base64," + base64.b64encode(mp4_bytes(frames, rate)).decode()


def gray_frames(count: int, height: int = 64, width: int = 96, step: int = 10) -> np.ndarray:
    """Frame i is uniform gray ``i * step``: a sampled frame's mean names which it was."""
    levels = (np.arange(count) * step).clip(0, 255).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, height, width, 3)).copy()
