"""Chunked, batched Code2wav decode concatenates to the full decode."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.codec.chunked import ChunkPlanner, CodecDecoder, DecodeJob
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder


@pytest.fixture(scope="module")
def decoder(tiny_omni_path):
    return load_code2wav_decoder(tiny_omni_path)


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def stream(planner: ChunkPlanner, codes: torch.Tensor, piece: int):
    jobs = []
    for start in range(0, codes.shape[1], piece):
        jobs += planner.push(codes[:, start : start + piece])
    last = planner.finish()
    return jobs + ([last] if last else [])


@pytest.mark.parametrize("frames", [1, 4, 5, 29, 30, 160])
@pytest.mark.parametrize("piece", [1, 7])
@pytest.mark.parametrize("growth", [1.0, 2.0])
def test_chunks_concatenate_to_full_decode(decoder, frames, piece, growth):
    codec, context = decoder
    codes = random_codes(frames)
    with torch.no_grad():
        full = codec.decode_fn(codes[None])[0]
    planner = ChunkPlanner(
        codec.samples_per_frame, first_chunk=4, chunk=25, left_context=context, growth=growth
    )
    jobs = stream(planner, codes, piece)
    audio = torch.cat(codec.run(jobs))
    padded = CodecDecoder(codec.decode_fn, codec.samples_per_frame, conv_history=8, max_batch=64)
    torch.testing.assert_close(torch.cat(padded.run(jobs)), full, atol=1e-4, rtol=0)
    assert audio.shape == full.shape
    torch.testing.assert_close(audio, full, atol=1e-4, rtol=0)
    assert sum(j.num_frames for j in jobs) == frames
    if frames >= 5:
        assert jobs[0].num_frames == 4  # first audio after 4 frames (+1 look-ahead)


def test_chunks_ramp_up_from_the_first_to_the_steady_size():
    planner = ChunkPlanner(1920, first_chunk=2, chunk=25, left_context=10)
    sizes = [job.num_frames for job in planner.push(torch.zeros(16, 120, dtype=torch.long))]
    assert sizes == [2, 4, 8, 16, 25, 25, 25]  # 105 frames; the 1 look-ahead frame waits
    steady = ChunkPlanner(1920, first_chunk=4, chunk=25, growth=1.0)
    assert [j.num_frames for j in steady.push(torch.zeros(16, 40, dtype=torch.long))] == [4] * 9
    # A slow ramp grows unrounded: round(2 * 1.25) is 2, and the next 3.125 makes it 3.
    slow = ChunkPlanner(1920, first_chunk=2, chunk=25, growth=1.25)
    sizes = [j.num_frames for j in slow.push(torch.zeros(16, 160, dtype=torch.long))]
    assert sizes == [2, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 25]


def test_too_little_left_context_is_wrong(decoder):
    """The test above can fail: with half the receptive field the chunks drift."""
    codec, context = decoder
    codes = random_codes(160)
    with torch.no_grad():
        full = codec.decode_fn(codes[None])[0]
    planner = ChunkPlanner(codec.samples_per_frame, left_context=context // 2)
    audio = torch.cat(codec.run(stream(planner, codes, 160)))
    assert (audio - full).abs().max() > 1e-2


def test_streams_of_different_lengths_batch_together(decoder):
    codec, context = decoder
    codec = CodecDecoder(codec.decode_fn, codec.samples_per_frame, conv_history=8, max_batch=8)
    streams = [random_codes(n, seed=n) for n in (3, 12, 40)]
    finals = []
    for codes in streams:
        planner = ChunkPlanner(codec.samples_per_frame, first_chunk=1000, left_context=context)
        finals.append(planner.push(codes) + [planner.finish()])
    outs = codec.run([f[-1] for f in finals])
    for codes, out in zip(streams, outs, strict=True):
        with torch.no_grad():
            alone = codec.decode_fn(codes[None])[0]
        torch.testing.assert_close(out, alone, atol=1e-4, rtol=0)


def test_planner_rejects_bad_sizes_and_push_after_finish():
    with pytest.raises(ValueError):
        ChunkPlanner(1920, first_chunk=0)
    with pytest.raises(ValueError):
        ChunkPlanner(1920, growth=0.5)
    planner = ChunkPlanner(1920)
    planner.finish()
    with pytest.raises(RuntimeError):
        planner.push(torch.zeros(16, 1, dtype=torch.long))


def test_bfloat16_decoder_is_close_to_float32(tiny_omni_path, decoder):
    codec32, _ = decoder
    codec16, _ = load_code2wav_decoder(tiny_omni_path, torch.bfloat16)
    codes = random_codes(12)
    with torch.no_grad():
        a, b = codec32.decode_fn(codes[None])[0], codec16.decode_fn(codes[None])[0]
    assert b.dtype == torch.float32 and a.shape == b.shape
    assert (a - b).pow(2).mean().sqrt() < 0.2 * a.pow(2).mean().sqrt()


def test_a_job_pickles_its_codes_as_numpy_not_as_a_torch_tensor():
    """Jobs go to the codec stage as handle arguments, one call per chunk: a torch tensor costs
    ~100 us to pickle and load, numpy ~15."""
    import pickle

    job = DecodeJob(torch.randint(0, 2048, (16, 40)), 0, 100, 0, 25, stream_id="s")
    data = pickle.dumps(job)
    assert b"torch" not in data
    back = pickle.loads(data)
    assert torch.equal(back.codes, job.codes) and back.codes.dtype == torch.int64
    assert (back.skip_samples, back.keep_samples, back.stream_id) == (0, 100, "s")


def test_aligned_plan_keeps_whole_blocks():
    """A block codec's jobs: every size and context a multiple of the block, growth kept."""
    planner = ChunkPlanner(480, first_chunk=1, chunk=40, left_context=24, lookahead=12, align=12)
    jobs = planner.push(torch.zeros(1, 200, dtype=torch.long))
    assert [j.num_frames for j in jobs] == [12, 24, 48, 48, 48]  # the cap of 40 rounds up
    assert all(j.context_start % 12 == 0 for j in jobs)
    assert jobs[-1].first_frame + jobs[-1].num_frames + 12 <= 200
    with pytest.raises(ValueError, match="align"):
        ChunkPlanner(480, left_context=10, align=12)


def test_the_first_chunk_may_look_ahead_less():
    """``first_lookahead``: the first job waits for fewer frames; later ones for ``lookahead``."""
    planner = ChunkPlanner(
        480, first_chunk=12, chunk=24, left_context=24, lookahead=24, align=12, first_lookahead=12
    )
    assert planner.push(torch.zeros(1, 23, dtype=torch.long)) == []
    (first,) = planner.push(torch.zeros(1, 1, dtype=torch.long))  # 12 + 12 frames
    assert (first.num_frames, first.codes.shape[1]) == (12, 24)
    assert planner.push(torch.zeros(1, 35, dtype=torch.long)) == []  # 12 + 24 + 24 > 59
    (second,) = planner.push(torch.zeros(1, 1, dtype=torch.long))
    assert (second.first_frame, second.num_frames, second.codes.shape[1]) == (12, 24, 60)
    with pytest.raises(ValueError, match="look-ahead"):
        ChunkPlanner(480, first_lookahead=-1)
