"""Server turn detection (``server_vad``): silero-vad hears the user's audio as it streams in
and says when speech starts and when it has stopped for ``silence_duration_ms``.

silero-vad takes 32 ms windows at 16 kHz, so the 24 kHz input is resampled on the way in
(``soxr``'s streaming resampler: no seams between appends). Its model keeps state across
windows, so each session has its own (loaded in ~30 ms, ~1 ms per window on one core).
Times are in milliseconds of the audio heard so far in the session, as OpenAI's
``audio_start_ms`` and ``audio_end_ms`` are.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from omni_serve.api.realtime.protocol import PCM_RATE, TurnDetection

VAD_RATE = 16_000
WINDOW = 512  # samples at 16 kHz: the window silero-vad's 16 kHz model takes
WINDOW_MS = WINDOW * 1000 // VAD_RATE
HYSTERESIS = 0.15  # silence is a probability this far under the threshold (silero's own rule)


@dataclass(frozen=True)
class SpeechEdge:
    # "started"; "quiet" (silent for ``quiet_ms`` so far, the turn may be ending); "resumed"
    # (speech again after a "quiet"); "stopped" (silent for the whole silence window)
    kind: str
    audio_ms: int  # started: the speech's start less the prefix padding; others: detection


# The sessions' hearing runs here, not in the default thread pool, where prompts' media are
# decoded (seconds for a video): a turn's end must not be heard late behind them.
_HEARING = ThreadPoolExecutor(2, thread_name_prefix="omni-vad")


def load_vad_model() -> torch.nn.Module:
    from silero_vad import load_silero_vad

    return load_silero_vad()  # the TorchScript model the wheel ships: nothing is downloaded


class VoiceActivity:
    def __init__(
        self,
        settings: TurnDetection,
        model: torch.nn.Module | None = None,
        quiet_ms: int | None = None,
    ) -> None:
        import soxr

        self.settings = settings
        self.quiet_ms = quiet_ms  # None: no "quiet" edges
        self._quiet = False  # a "quiet" edge was given for the silence now
        self.model = model if model is not None else load_vad_model()
        # "LQ": holds back ~6 ms of input where the default holds ~21 ms (the VAD needs no HQ)
        self._resampler = soxr.ResampleStream(PCM_RATE, VAD_RATE, 1, dtype="float32", quality="LQ")
        self._pending = np.zeros(0, np.float32)
        self.heard_ms = 0  # audio heard so far, in whole windows
        self.speaking = False
        self._silent_since: int | None = None

    async def hear_soon(self, pcm: bytes) -> list[SpeechEdge]:
        """``hear`` on the hearing threads, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(_HEARING, self.hear, pcm)

    def hear(self, pcm: bytes) -> list[SpeechEdge]:
        """The edges in ``pcm`` (PCM16 mono 24 kHz), in order. Runs the model: call it off
        the event loop."""
        samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
        self._pending = np.concatenate([self._pending, self._resampler.resample_chunk(samples)])
        edges = []
        with torch.inference_mode():
            while len(self._pending) >= WINDOW:
                window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
                p = float(self.model(torch.from_numpy(window), VAD_RATE))
                edge = self._step(p)
                if edge is not None:
                    edges.append(edge)
        return edges

    def _step(self, p: float) -> SpeechEdge | None:
        s = self.settings
        start, self.heard_ms = self.heard_ms, self.heard_ms + WINDOW_MS
        if not self.speaking:
            if p < s.threshold:
                return None
            self.speaking, self._silent_since = True, None
            return SpeechEdge("started", max(0, start - s.prefix_padding_ms))
        if p >= max(s.threshold - HYSTERESIS, 0.01):
            self._silent_since = None
            if self._quiet:
                self._quiet = False
                return SpeechEdge("resumed", self.heard_ms)
            return None
        if self._silent_since is None:
            self._silent_since = start
        silent_ms = self.heard_ms - self._silent_since
        if silent_ms >= s.silence_duration_ms:
            self.speaking, self._quiet = False, False
            return SpeechEdge("stopped", self.heard_ms)
        if self.quiet_ms is not None and silent_ms >= self.quiet_ms and not self._quiet:
            self._quiet = True
            return SpeechEdge("quiet", self.heard_ms)
        return None
