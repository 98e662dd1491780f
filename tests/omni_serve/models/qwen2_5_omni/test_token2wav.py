"""Token2Wav as a streaming codec: one-shot it equals transformers bit for bit (the whole
``generate``'s audio included); chunked it stays within the bound its block context gives."""

from __future__ import annotations

import pytest
import torch

from omni_serve.models.qwen2_5_omni.token2wav import Token2WavDecoder, Token2WavSettings
from tests.omni_serve.models.qwen2_5_omni.conftest import KINDS
from tests.reference_qwen2_5_omni import NOISE_SEED, SPEAKER

# Largest |chunked - one-shot| sample with 4 blocks of left and 2 of right context: measured
# 1.0e-4 on tiny and 9.5e-5 on small (audio RMS ~0.15); without left context it is ~0.4.
CHUNKED_BOUND = 5e-4
# A first chunk decoded with 1 block of right context, not 2: 6.7e-3 measured on this preset
# (5.7e-3 on the small one; the waveform's RMS there is ~0.14). docs/models.md.
FIRST_CHUNK_BOUND = 1e-2
# Block-local attention against transformers' dense attention (the same keys, summed in
# another order): the largest sample difference measured 3.8e-6 here (2.2e-6 on the small
# preset; audio RMS ~0.15).
BLOCK_LOCAL_BOUND = 1e-5


def decoder(model, **settings) -> Token2WavDecoder:
    return Token2WavDecoder(model.token2wav, model.speaker_map, Token2WavSettings(**settings))


def random_codes(n: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(3))


def streamed(dec: Token2WavDecoder, codes: torch.Tensor, piece: int) -> tuple[torch.Tensor, list]:
    """Codes pushed ``piece`` at a time as a Talker makes them; the chunks concatenated."""
    planner = dec.codec_info().planner("stream", SPEAKER)
    jobs = []
    for i in range(0, codes.shape[1], piece):
        jobs += planner.push(codes[:, i : i + piece])
    last = planner.finish()
    jobs += [last] if last is not None else []
    return torch.cat(dec.run(jobs)), jobs


def test_one_shot_equals_transformers_token2wav(tiny_model):
    """Against upstream's own DiT: the block mask it builds (not ours, which decoders of the
    shared model set on it) and the speaker encoder run every evaluation."""
    codes = random_codes(50)
    speaker = tiny_model.speaker_map[SPEAKER]
    dit = tiny_model.token2wav.code2wav_dit_model
    dit.__dict__.pop("_create_block_diff", None)
    memo = dit.input_embed.spk_encoder
    dit.input_embed.spk_encoder = getattr(memo, "inner", memo)
    torch.manual_seed(5)
    with torch.no_grad():
        theirs = tiny_model.token2wav(
            codes, conditioning=speaker["cond"], reference_mel=speaker["ref_mel"]
        ).reshape(-1)
    dense = decoder(tiny_model, noise_seed=5, block_local_attention=False)
    assert torch.equal(dense.decode(codes, SPEAKER), theirs)
    local = decoder(tiny_model, noise_seed=5).decode(codes, SPEAKER)
    assert 0 < (local - theirs).abs().max() < BLOCK_LOCAL_BOUND


@pytest.mark.parametrize("kind", KINDS)
def test_audio_of_the_whole_generate(tiny_model, reference_runs, kind):
    """transformers' generate decodes the Talker's codes (which the Talker golden tests
    reproduce) with the first noise after its seed: the decoder gives the same waveform."""
    run = reference_runs[kind]
    dense = decoder(tiny_model, noise_seed=NOISE_SEED, block_local_attention=False)
    assert torch.equal(dense.decode(run.codes[None], SPEAKER), run.waveform)


def test_chunked_stays_within_the_bound_of_its_context(tiny_model):
    codes = random_codes(150)
    dec = decoder(tiny_model, left_blocks=4, right_blocks=2)
    one_shot = dec.decode(codes, SPEAKER)
    wav, jobs = streamed(dec, codes, piece=7)
    assert len(jobs) > 2 and len(wav) == len(one_shot) == 150 * dec.samples_per_frame
    assert (wav - one_shot).abs().max() < CHUNKED_BOUND
    blind = decoder(tiny_model, left_blocks=0, right_blocks=2)  # the bound is context's doing
    assert (streamed(blind, codes, piece=7)[0] - one_shot).abs().max() > 10 * CHUNKED_BOUND


def test_the_vocoder_over_a_margin_gives_the_whole_windows_samples(tiny_model):
    """BigVGAN run over each chunk's mel and a block either side, not the whole window: the
    same samples within float rounding (2.6e-6 measured); with no margin, far off."""
    codes = random_codes(150)
    whole, _ = streamed(decoder(tiny_model, vocoder_margin_blocks=None), codes, piece=7)
    margin, jobs = streamed(decoder(tiny_model), codes, piece=7)
    assert len(margin) == len(whole) and len(jobs) > 2
    assert (margin - whole).abs().max() < 1e-5
    bare, _ = streamed(decoder(tiny_model, vocoder_margin_blocks=0), codes, piece=7)
    assert len(bare) == len(whole) and (bare - whole).abs().max() > 1e-2


def test_a_first_chunk_with_less_right_context_stays_within_its_own_bound(tiny_model):
    """``first_right_blocks: 1``: the first chunk's audio comes 12 codes sooner, within the
    first chunk's bound; every later sample is what the default plan gives."""
    codes = random_codes(150)
    dec = decoder(tiny_model, left_blocks=4, right_blocks=2)
    one_shot = dec.decode(codes, SPEAKER)
    default, _ = streamed(dec, codes, piece=7)
    soon = decoder(tiny_model, left_blocks=4, right_blocks=2, first_right_blocks=1)
    planner = soon.codec_info().planner("s", SPEAKER)
    block = soon.codes_per_block
    assert planner.push(codes[:, : 2 * block - 1]) == []
    assert len(planner.push(codes[:, 2 * block - 1 : 2 * block])) == 1  # 2 blocks, not 3
    wav, _ = streamed(soon, codes, piece=7)
    first = block * soon.samples_per_frame
    assert CHUNKED_BOUND < (wav[:first] - one_shot[:first]).abs().max() < FIRST_CHUNK_BOUND
    assert torch.equal(wav[first:], default[first:])


def test_jobs_start_on_blocks_and_wait_for_their_right_context(tiny_model):
    dec = decoder(tiny_model, left_blocks=2, right_blocks=1, first_chunk_blocks=1)
    block = dec.codes_per_block
    planner = dec.codec_info().planner("s", SPEAKER)
    assert planner.push(random_codes(2 * block - 1)) == []  # a block, but not its look-ahead
    (job,) = planner.push(random_codes(1))
    assert (job.first_frame, job.num_frames, job.codes.shape[1]) == (0, block, 2 * block)
    jobs = planner.push(random_codes(6 * block))
    assert all(j.context_start % block == 0 and j.num_frames % block == 0 for j in jobs)
    assert all(j.voice == SPEAKER for j in jobs)


def test_a_job_without_a_voice_or_off_its_blocks_is_refused(tiny_model):
    dec = decoder(tiny_model)
    planner = dec.codec_info().planner("s")  # no voice
    planner.push(random_codes(100))
    with pytest.raises(ValueError, match="voice"):
        dec.run([planner.finish()])
    with pytest.raises(ValueError, match="unknown voice"):
        dec.decode(random_codes(12), "Nobody")


def test_settings_come_from_engine_args_and_refuse_unknown_keys(tiny_model):
    settings = Token2WavSettings.from_args({"num_steps": 4, "guidance_scale": 0.0})
    assert (settings.num_steps, settings.guidance_scale) == (4, 0.0)
    assert Token2WavSettings().chunks_in_flight == 2  # stateless windows: side by side
    assert decoder(tiny_model, chunks_in_flight=3).codec_info().chunks_in_flight == 3
    with pytest.raises(ValueError, match="num_step"):
        Token2WavSettings.from_args({"num_step": 4})
    with pytest.raises(ValueError, match="chunks_in_flight must be"):
        Token2WavSettings.from_args({"chunks_in_flight": 0})
    with pytest.raises(ValueError, match="vocoder_margin_blocks must be"):
        Token2WavSettings.from_args({"vocoder_margin_blocks": -1})


def test_fewer_ode_steps_change_the_audio(tiny_model):
    """The pipeline's solver settings reach the ODE (not a silently fixed default)."""
    codes = random_codes(24)
    ten = decoder(tiny_model).decode(codes, SPEAKER)
    four = decoder(tiny_model, num_steps=4).decode(codes, SPEAKER)
    unguided = decoder(tiny_model, guidance_scale=0.0).decode(codes, SPEAKER)
    assert not torch.equal(ten, four) and not torch.equal(ten, unguided)


def test_the_voice_encoder_runs_once_a_window_and_changes_nothing(tiny_qwen2_5_omni_path):
    """The reference mel's encoder is remembered across the ODE's evaluations: the waveform is
    transformers' own (a fresh model, no memo) bit for bit."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    fresh = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_qwen2_5_omni_path).eval()
    speaker = fresh.speaker_map[SPEAKER]
    codes = random_codes(36)
    torch.manual_seed(0)
    with torch.no_grad():
        theirs = fresh.token2wav(
            codes, conditioning=speaker["cond"], reference_mel=speaker["ref_mel"]
        ).reshape(-1)
    dec = decoder(fresh, block_local_attention=False)
    memo = dec.dit.input_embed.spk_encoder
    assert torch.equal(dec.decode(codes, SPEAKER), theirs)
    assert memo.runs == 1  # guided and unguided rows go through it together, every evaluation
