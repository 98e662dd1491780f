"""Real speech offline, for tests and benchmarks: eSpeak NG, from the ``espeakng-loader``
wheel (which ships the library and its voice data; no system package needed), driven
through its C API. The clips are a formant synthesizer's, not a person's, but voice
activity detection and the audio encoder hear them as speech.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

_SYNCHRONOUS = 2  # AUDIO_OUTPUT_SYNCHRONOUS: espeak_Synth returns once the callback had it all
_CHARS_UTF8 = 1
_RATE = 1  # espeakRATE, words per minute
_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)
_lock = threading.Lock()  # the library holds one synthesizer per process


@functools.cache
def _library() -> tuple[ctypes.CDLL, int]:
    import espeakng_loader

    lib = ctypes.CDLL(espeakng_loader.get_library_path())
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    rate = lib.espeak_Initialize(_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
    if rate <= 0:
        raise RuntimeError(f"espeak_Initialize failed ({rate})")
    uint, ptr = ctypes.c_uint, ctypes.c_void_p
    lib.espeak_Synth.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        uint,
        ctypes.c_int,
        uint,
        uint,
        ptr,
        ptr,
    ]
    return lib, rate


def speak(text: str, sample_rate: int = 24_000, voice: str = "en", wpm: int = 160) -> np.ndarray:
    """``text`` spoken, as float32 mono at ``sample_rate``."""
    import soxr

    lib, rate = _library()
    chunks: list[np.ndarray] = []

    def take(wav: Any, n: int, _events: Any) -> int:  # called inside espeak_Synth, here
        if n > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    callback = _CALLBACK(take)
    data = text.encode()
    with _lock:
        lib.espeak_SetSynthCallback(callback)
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"eSpeak NG has no voice {voice!r}")
        lib.espeak_SetParameter(_RATE, wpm, 0)
        error = lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        if error != 0:
            raise RuntimeError(f"espeak_Synth failed ({error})")
        lib.espeak_Synchronize()
    samples = np.concatenate(chunks).astype(np.float32) / 32768.0
    return soxr.resample(samples, rate, sample_rate).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as PCM16 little-endian bytes."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
