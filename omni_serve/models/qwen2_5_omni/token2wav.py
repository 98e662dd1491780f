"""Qwen2.5-Omni's Token2Wav as a streaming codec: codec tokens → mel (a flow-matching DiT) →
24 kHz waveform (BigVGAN), decoded chunk by chunk as the Talker makes the tokens.

The DiT attends within blocks of ``block_size`` mel frames counted from its input's start
(some layers one block back or ahead), so a chunk is decoded in a window of whole blocks:
``left_blocks`` before it and ``right_blocks`` after it (the chunk planner aligns every job to
blocks and holds a chunk back until its right context exists). The ODE spreads each block's
dependence one block further per solver step, so a window cannot equal the one-shot decode
bit for bit; the bound by context is measured in ``load_tests/token2wav_chunk_bound.py`` and
held by a test. BigVGAN then runs over the window's whole mel, so the chunk's samples see
mel context on both sides, and only the chunk's samples are kept.

Noise is a function of position: one seeded table per decoder (extended in order as longer
streams need it), so a job decodes the same whatever replica runs it, a reply reproduces,
and the one-shot decode of a stream draws exactly what ``torch.manual_seed(noise_seed)``
followed by transformers' ``Token2Wav`` forward draws.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

from omni_serve.compat.transformers import qwen2_5_omni_dit_broadcast_block_mask
from omni_serve.engines.codec.chunked import CodecInfo, DecodeJob
from omni_serve.models.qwen2_5_omni.dit_attention import block_local_layers

SAMPLE_RATE = 24_000
NOISE_GROWTH_FRAMES = 4096  # the noise table grows by this many mel frames at a time


@dataclass(frozen=True)
class Token2WavSettings:
    """The ODE solver, guidance and streaming context (a pipeline's ``engine.args``)."""

    num_steps: int = 10  # transformers' default
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0
    left_blocks: int = 4
    right_blocks: int = 2
    # The first chunk's right context (None: ``right_blocks``). One block less makes the
    # first audio wait 12 codes less, for a first chunk further from the one-shot decode
    # (docs/models.md gives the bound measured for each context).
    first_right_blocks: int | None = None
    first_chunk_blocks: int = 1
    chunk_blocks: int = 8
    chunk_growth: float = 2.0
    noise_seed: int = 0
    # Each DiT block attends only to the blocks its layer allows, not the whole window under
    # a mask: within float rounding of transformers' dense attention (``dit_attention.py``),
    # and a long window's decode a third quicker. False: upstream's dense path, bit for bit.
    block_local_attention: bool = True
    # A stream's chunks decoding at once (each decodes from its own window, so the next
    # need not wait for the last): with as many codec replicas, one reply uses that many cores.
    chunks_in_flight: int = 2
    # BigVGAN's reach is under 2 DiT blocks of mel: it runs over the chunk's mel and this many
    # blocks either side, not the whole window (1: within 3e-6 of the whole window's samples;
    # a steady window's vocoder 1.50 -> 1.09 s on the small preset). None: the whole window.
    vocoder_margin_blocks: int | None = 1

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> Token2WavSettings:
        known = cls.__dataclass_fields__
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"unknown Token2Wav settings {unknown}; known: {sorted(known)}")
        settings = cls(**args)
        if settings.chunks_in_flight < 1:
            raise ValueError(f"chunks_in_flight must be >= 1, got {settings.chunks_in_flight}")
        margin = settings.vocoder_margin_blocks
        if margin is not None and margin < 0:
            raise ValueError(f"vocoder_margin_blocks must be >= 0 or null, got {margin}")
        return settings


class RepeatedInputMemo(torch.nn.Module):
    """Runs ``inner`` again only when its input changes. The DiT encodes the voice's reference
    mel (an ECAPA-TDNN, conv-heavy) in every ODE evaluation, 36 of them per window at 10 steps,
    always on the same input: remembering the last result left a small-preset window's decode
    2.71 -> 2.32 s, the output bit for bit the same (load_tests notes in docs/models.md)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        same = self._input is not None and self._input.shape == x.shape
        if not (same and torch.equal(self._input, x)):
            self._input, self._output = x.clone(), self.inner(x)
            self.runs += 1
        return self._output


class Token2WavDecoder:
    """Decodes ``DecodeJob``s of one stream's codes ([1, n] each) to waveforms."""

    def __init__(self, token2wav: Any, speakers: dict[str, dict], settings: Token2WavSettings):
        self.dit = token2wav.code2wav_dit_model.eval()
        qwen2_5_omni_dit_broadcast_block_mask(self.dit)
        embed = self.dit.input_embed
        if not isinstance(embed.spk_encoder, RepeatedInputMemo):
            embed.spk_encoder = RepeatedInputMemo(embed.spk_encoder)
        self.vocoder = token2wav.code2wav_bigvgan_model.eval()
        self.speakers = speakers
        self.settings = settings
        self.codes_per_block = self.dit.block_size // self.dit.repeats
        self.samples_per_frame = self._samples_per_mel_frame() * self.dit.repeats  # per code
        self.streams = None  # stateless: every job decodes from its own window
        self._noise = torch.empty(1, 0, self.dit.mel_dim)
        self._generator = torch.Generator().manual_seed(settings.noise_seed)

    def codec_info(self) -> CodecInfo:
        s, block = self.settings, self.codes_per_block
        return CodecInfo(
            self.samples_per_frame,
            left_context=s.left_blocks * block,
            first_chunk_frames=s.first_chunk_blocks * block,
            chunk_frames=s.chunk_blocks * block,
            chunk_growth=s.chunk_growth,
            lookahead=s.right_blocks * block,
            align=block,
            first_lookahead=None if s.first_right_blocks is None else s.first_right_blocks * block,
            chunks_in_flight=s.chunks_in_flight,
        )

    def _samples_per_mel_frame(self) -> int:
        rates = self.vocoder.config.upsample_rates
        out = 1
        for rate in rates:
            out *= rate
        return out

    def noise(self, start: int, end: int) -> torch.Tensor:
        """The initial ODE state of mel frames [start, end)."""
        while self._noise.shape[1] < end:
            more = torch.randn(1, NOISE_GROWTH_FRAMES, self.dit.mel_dim, generator=self._generator)
            self._noise = torch.cat([self._noise, more], dim=1)
        return self._noise[:, start:end]

    @torch.no_grad()
    def mel(self, codes: torch.Tensor, voice: str, first_frame: int = 0) -> torch.Tensor:
        """transformers' ``Qwen2_5OmniToken2WavDiTModel.sample`` over codes [1, n] whose first
        mel frame is ``first_frame`` of the stream, with that position's noise: [1, mel, T]."""
        speaker = self._speaker(voice)
        dit, s = self.dit, self.settings
        frames = codes.shape[1] * dit.repeats
        if frames > dit.config.max_position_embeddings:
            raise ValueError(f"{frames} mel frames exceed the DiT's maximum positions")
        cond = speaker["cond"].float().unsqueeze(1).repeat(1, frames, 1)
        reference = speaker["ref_mel"].float()

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            kwargs = dict(
                hidden_states=x,
                speaker_embedding=cond,
                condition_vector=reference,
                quantized_code=codes,
                time_step=t,
            )
            if s.guidance_scale < 1e-5:
                return dit(**kwargs, apply_cfg=False)
            guided, null = torch.chunk(dit(**kwargs, apply_cfg=True), 2, dim=0)
            return guided + (guided - null) * s.guidance_scale

        times = torch.linspace(0, 1, s.num_steps, dtype=cond.dtype)
        if s.sway_coefficient is not None:
            times += s.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        start = self.noise(first_frame, first_frame + frames).clone()
        local = block_local_layers(dit) if s.block_local_attention else nullcontext()
        with local:
            solution = RungeKutta4ODESolver(velocity, start).integrate(times)
        return solution[-1].permute(0, 2, 1)

    @torch.no_grad()
    def waveform(self, mel: torch.Tensor) -> torch.Tensor:
        return self.vocoder(mel).reshape(-1).float()

    def decode(self, codes: torch.Tensor, voice: str) -> torch.Tensor:
        """The one-shot decode of a whole stream [1, n]: what transformers' Token2Wav gives
        after ``torch.manual_seed(noise_seed)`` (bit for bit without block-local attention,
        within float rounding with it)."""
        return self.waveform(self.mel(codes, voice))

    def run(self, jobs: list[DecodeJob]) -> list[torch.Tensor]:
        """Each job alone (windows differ in length, and the DiT has no padding mask)."""
        out = []
        for job in jobs:
            if job.voice is None:
                raise ValueError("Token2Wav jobs need a voice (plan them with one)")
            if job.context_start % self.codes_per_block:
                raise ValueError("Token2Wav jobs must start on a DiT block (plan with align)")
            first_frame = job.context_start * self.dit.repeats
            mel = self.mel(job.codes[:1], job.voice, first_frame)
            out.append(self._chunk_waveform(mel, job.skip_samples, job.keep_samples))
        return out

    def _chunk_waveform(self, mel: torch.Tensor, skip: int, keep: int | None) -> torch.Tensor:
        """The samples [skip, skip + keep) of the window's waveform (to its end: None), made
        from the chunk's mel and ``vocoder_margin_blocks`` blocks of it either side."""
        margin = self.settings.vocoder_margin_blocks
        if margin is None:
            wav = self.waveform(mel)
            return wav[skip : None if keep is None else skip + keep]
        per_frame = self.samples_per_frame // self.dit.repeats  # samples per mel frame
        frames = mel.shape[-1]
        first = skip // per_frame
        last = frames if keep is None else -(-(skip + keep) // per_frame)
        lo = max(0, first - margin * self.dit.block_size)
        hi = min(frames, last + margin * self.dit.block_size)
        wav = self.waveform(mel[..., lo:hi])
        start = skip - lo * per_frame
        return wav[start : None if keep is None else start + keep]

    def _speaker(self, voice: str) -> dict:
        for name, params in self.speakers.items():
            if name.lower() == voice.lower():
                return params
        raise ValueError(f"unknown voice {voice!r}; voices: {sorted(self.speakers)}")
