"""The listener's stall that the speech benchmark reports."""

from __future__ import annotations

import pytest

from omni_serve.testing.playback import Playhead


def heard(packets: list[tuple[float, float]]) -> float:
    playhead = Playhead()
    for at, duration in packets:
        playhead.arrive(at, duration)
    return playhead.stall_s


def test_packets_that_arrive_before_the_audio_runs_out_never_stall():
    assert heard([(1.0, 2.0), (2.5, 2.0), (4.9, 1.0)]) == 0.0


def test_a_late_packet_stalls_for_the_gap_and_playback_resumes_from_it():
    # plays 1-3 s, waits 1 s for the packet at 4 s, plays it 4-6 s, waits 0.5 s more
    assert heard([(1.0, 2.0), (4.0, 2.0), (6.5, 1.0)]) == pytest.approx(1.5)


def test_the_wait_for_the_first_audio_is_not_a_stall():
    assert heard([(9.0, 1.0)]) == 0.0
