"""Code2wav with per-stream transformer state decodes exactly what it decodes without: hits
skip the left context, and a job whose state is missing or stale falls back to it."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.codec.chunked import ChunkPlanner, DecodeJob
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder


def codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def jobs_of(codec, context: int, stream: torch.Tensor, stream_id: str | None) -> list[DecodeJob]:
    planner = ChunkPlanner(
        codec.samples_per_frame, first_chunk=2, chunk=25, left_context=context, stream_id=stream_id
    )
    jobs = []
    for start in range(0, stream.shape[1], 7):
        jobs += planner.push(stream[:, start : start + 7])
    return jobs + [planner.finish()]


def full_decode(codec, stream: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return codec.decode_fn(stream[None])[0]


@pytest.fixture()
def decoder(tiny_omni_path):
    return load_code2wav_decoder(tiny_omni_path)


@pytest.mark.parametrize("frames", [3, 40, 300])  # 300: past the 72-frame window, 3x over
def test_a_streams_chunks_concatenate_to_the_full_decode_from_its_state(decoder, frames):
    codec, context = decoder
    stream = codes(frames, seed=frames)
    jobs = jobs_of(codec, context, stream, "s1")
    audio = torch.cat(codec.run(jobs))
    torch.testing.assert_close(audio, full_decode(codec, stream), atol=1e-4, rtol=0)
    assert (codec.streams.hits, codec.streams.misses) == (len(jobs), 0)
    assert len(codec.streams) == 0  # the last job freed the stream's state


def test_interleaved_streams_keep_their_own_state(decoder):
    codec, context = decoder
    streams = {name: codes(120, seed=i) for i, name in enumerate("ab")}
    jobs = {name: jobs_of(codec, context, s, name) for name, s in streams.items()}
    out: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    for pair in zip(jobs["a"], jobs["b"], strict=False):
        for job, audio in zip(pair, codec.run(list(pair)), strict=True):
            out[job.stream_id].append(audio)
    for name, stream in streams.items():
        torch.testing.assert_close(
            torch.cat(out[name]), full_decode(codec, stream), atol=1e-4, rtol=0
        )


def test_jobs_whose_state_is_elsewhere_or_stale_decode_from_their_left_context(tiny_omni_path):
    """A stream's jobs split over two replicas (routing fell back mid-stream). A job that
    finds state a little behind catches up from its own codes (they start before the gap);
    a replica that never saw the stream's start, or whose state is older than the job's left
    context, decodes from the left context. Every job is exact either way."""
    (first, context), (second, _), (third, _) = (
        load_code2wav_decoder(tiny_omni_path) for _ in range(3)
    )
    stream = codes(300, seed=7)
    jobs = jobs_of(first, context, stream, "s")
    assert len(jobs) == 15 and jobs[5].context_start == 0 and jobs[12].context_start > 0
    where = [first] * 5 + [second] + [first] * 2 + [second] * 4 + [first] + [second] * 2
    audio = torch.cat([codec.run([job])[0] for codec, job in zip(where, jobs, strict=True)])
    torch.testing.assert_close(audio, full_decode(first, stream), atol=1e-4, rtol=0)
    # first: jobs 0-4; 6-7 catch up over job 5 from their own codes; 12 finds its state older
    # than its left context reaches (jobs 8-11 went elsewhere): dropped, a miss
    assert (first.streams.hits, first.streams.misses) == (7, 1) and len(first.streams) == 0
    # second: job 5 starts the stream's state (its codes reach back to frame 0), 8-11 and
    # 13-14 catch up over the jobs it did not see
    assert (second.streams.hits, second.streams.misses) == (7, 0)
    # a replica that never saw the stream's start cannot build its state
    torch.testing.assert_close(third.run([jobs[12]])[0], first.run([jobs[12]])[0])
    assert (third.streams.hits, third.streams.misses) == (0, 1) and len(third.streams) == 0


def test_abandoned_streams_are_dropped(tiny_omni_path):
    codec, context = load_code2wav_decoder(tiny_omni_path)
    for i in range(4):  # first jobs only: the clients went away
        codec.run(jobs_of(codec, context, codes(30, seed=i), f"s{i}")[:1])
    codec.streams.max_streams = 2
    codec.run(jobs_of(codec, context, codes(30, seed=9), "s9")[:1])
    assert len(codec.streams) == 2  # least recently used went first
    codec.streams.idle_s = 0.0
    codec.run(jobs_of(codec, context, codes(30, seed=10), "s10")[:1])
    assert len(codec.streams) == 1  # only the stream just served is left


def test_without_stream_state_every_job_decodes_from_its_left_context(tiny_omni_path):
    codec, context = load_code2wav_decoder(tiny_omni_path, stream_state=False)
    stream = codes(100, seed=3)
    audio = torch.cat(codec.run(jobs_of(codec, context, stream, "s")))
    torch.testing.assert_close(audio, full_decode(codec, stream), atol=1e-4, rtol=0)
    assert codec.streams is None
