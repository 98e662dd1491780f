"""What a listener of a streamed spoken reply hears: playback starts with the first audio and
stalls whenever the next packet has not arrived by the time everything before it has played."""

from __future__ import annotations


class Playhead:
    def __init__(self) -> None:
        self.played_until: float | None = None  # when the audio received so far ends playing
        self.stall_s = 0.0  # silence after the first audio, summed

    def arrive(self, at_s: float, duration_s: float) -> None:
        """A packet of ``duration_s`` seconds of audio arrives at ``at_s``."""
        if self.played_until is None:
            self.played_until = at_s
        elif at_s > self.played_until:
            self.stall_s += at_s - self.played_until
            self.played_until = at_s
        self.played_until += duration_s
