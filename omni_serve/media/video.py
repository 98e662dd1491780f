"""Video content parts: the file (``media.url_bytes``) → RGB frames sampled at a fixed rate.

Why a fixed rate: Qwen3-Omni places a video's frames in time (M-RoPE positions from the
seconds each temporal patch covers), and transformers' processor and vLLM's take one ``fps``
per request, so every video is sampled at the API's ``video_fps`` and that rate goes with the
prompt. Why the limits: decoding runs in the ingress and every frame held is W x H x 3 bytes,
so the file size, the duration and each frame's pixels are bounded before the frames exist.
"""

from __future__ import annotations

import io

import av
import numpy as np

from omni_serve.media.decode import MediaError, check_long_enough


def _scaled(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The frame size within ``max_pixels``, aspect kept (even sides, as codecs want)."""
    if width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


def load_video(
    raw: bytes, param: str, *, max_seconds: float, fps: float, max_pixels: int
) -> np.ndarray:
    """Frames [T, H, W, 3] uint8: the first frame at or after each multiple of 1/``fps`` s."""
    frames: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(raw)) as container:
            if not container.streams.video:
                raise MediaError("the file has no video stream", param)
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                at = frame.time or 0.0
                if at > max_seconds:
                    raise MediaError(f"video is longer than the limit of {max_seconds} s", param)
                if at + 1e-6 < len(frames) / fps:
                    continue
                if not frames:  # a stream that changes size mid-way keeps its first one
                    width, height = _scaled(frame.width, frame.height, max_pixels)
                frames.append(frame.to_ndarray(format="rgb24", width=width, height=height))
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError):
        raise MediaError("could not decode video", param) from None
    if not frames:
        raise MediaError("video has no frames", param)
    return np.stack(frames)


def load_video_audio(
    raw: bytes, rate: int, param: str, *, max_seconds: float, min_samples: int = 1
) -> np.ndarray:
    """The video file's first audio track: mono float32 at ``rate``, for a request that has the
    model hear its videos (``use_audio_in_video``); ``min_samples`` as for ``load_audio``."""
    chunks: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(raw)) as container:
            if not container.streams.audio:
                raise MediaError("the video has no audio track to hear (use_audio_in_video)", param)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(container.streams.audio[0]):
                if (frame.time or 0.0) > max_seconds:
                    raise MediaError(f"video is longer than the limit of {max_seconds} s", param)
                chunks += [f.to_ndarray()[0] for f in resampler.resample(frame)]
            chunks += [f.to_ndarray()[0] for f in resampler.resample(None)]  # its buffered tail
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError):
        raise MediaError("could not decode the video's audio track", param) from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    check_long_enough(samples, rate, min_samples, param, what="the video's audio track")
    return samples
