"""The Qwen-Image denoising loop (the DiT stage), batched across requests and CFG branches.

diffusers' ``QwenImagePipeline.__call__`` runs one request, and its conditional and
unconditional (CFG) passes one after the other. Here every request of a batch contributes a
conditional row and, with CFG, an unconditional row, and ONE transformer call per step runs
them all: text embeddings of different lengths are right-padded and masked. The math per
request is diffusers' own (same latents from the seed, same timesteps, same CFG combination
with its norm rescale, same scheduler step), so the output matches the one-pass pipeline.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps
from diffusers.utils.torch_utils import randn_tensor

from omni_serve.engines.diffusion.step_cache import StepCache

VAE_SCALE_FACTOR = 8  # 2 ** len(temperal_downsample) of the Qwen-Image VAE


@dataclass
class ImageJob:
    """One image to denoise. Jobs run together only if ``shape_key`` matches."""

    prompt_embeds: torch.Tensor  # [L, D], valid rows only
    height: int
    width: int
    steps: int
    seed: int
    negative_embeds: torch.Tensor | None = None  # [L', D]; CFG runs when set and scale > 1
    true_cfg_scale: float = 4.0
    # Set when nobody waits for the image any more (from another thread).
    cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def __getstate__(self) -> dict:
        # Sent to parallel DiT workers: an Event does not pickle, and each side has its own.
        return {k: v for k, v in self.__dict__.items() if k != "cancel"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, cancel=threading.Event())

    @property
    def cfg(self) -> bool:
        return self.negative_embeds is not None and self.true_cfg_scale > 1

    @property
    def shape_key(self) -> tuple[int, int, int]:
        return (self.height, self.width, self.steps)


@dataclass
class DenoiseState:
    """One job between two steps: its latents and where it is in its own schedule."""

    job: ImageJob
    latents: torch.Tensor  # [seq, C]
    scheduler: FlowMatchEulerDiscreteScheduler
    timesteps: torch.Tensor
    index: int = 0

    @property
    def done(self) -> bool:
        return self.index >= len(self.timesteps)

    @property
    def batch_key(self) -> tuple[int, int]:
        """Jobs that can share a step: the same image size (the same sequence length)."""
        return (self.job.height, self.job.width)


class DenoiseCancelled(Exception):
    """Every job of the batch was cancelled; the loop stopped between two steps."""


def initial_latents(
    job: ImageJob, channels: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Packed noise [seq, C] exactly as the pipeline draws it for ``generator=seed`` (a CPU
    generator, so the noise is the same on any device)."""
    h = 2 * (job.height // (VAE_SCALE_FACTOR * 2))
    w = 2 * (job.width // (VAE_SCALE_FACTOR * 2))
    generator = torch.Generator().manual_seed(job.seed)
    noise = randn_tensor((1, 1, channels, h, w), generator=generator, device=device, dtype=dtype)
    return QwenImagePipeline._pack_latents(noise, 1, channels, h, w)[0]


def pad_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[n, L_max, D] right-padded embeddings and their mask (None when nothing is padded,
    as the pipeline passes it)."""
    longest = max(r.shape[0] for r in rows)
    embeds = torch.stack([torch.nn.functional.pad(r, (0, 0, 0, longest - len(r))) for r in rows])
    mask = torch.stack([torch.arange(longest, device=r.device) < len(r) for r in rows]).long()
    return embeds, (None if bool(mask.all()) else mask)


class Denoiser:
    """``step_cache``: cache-dit hooks already on ``transformer`` (refreshed per run)."""

    def __init__(
        self,
        transformer: torch.nn.Module,
        scheduler_config: dict,
        step_cache: StepCache | None = None,
    ) -> None:
        self.transformer = transformer.eval()
        self.scheduler_config = scheduler_config
        self.channels = transformer.config.in_channels // 4
        self.step_cache = step_cache
        self.last_cached_steps = 0

    def _timesteps(
        self, seq_len: int, steps: int, device: torch.device
    ) -> tuple[FlowMatchEulerDiscreteScheduler, list]:
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        cfg = scheduler.config
        mu = calculate_shift(
            seq_len,
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        sigmas = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler, timesteps

    def cancelled(self, jobs: list[ImageJob]) -> bool:
        """Checked before each step; parallel workers override it to agree on the answer."""
        return all(job.cancel.is_set() for job in jobs)

    def predict(
        self,
        rows: torch.Tensor,
        timestep: torch.Tensor,
        embeds: torch.Tensor,
        mask: torch.Tensor | None,
        img_shapes: list,
        conditional: int,
    ) -> torch.Tensor:
        """The transformer's velocity for every row: the first ``conditional`` rows are the
        jobs' prompts, the rest their CFG (negative prompt) twins."""
        return self.transformer(
            hidden_states=rows,
            timestep=timestep,
            encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask,
            img_shapes=img_shapes,
            return_dict=False,
        )[0]

    def start(self, job: ImageJob) -> DenoiseState:
        """The job's noise and its own schedule, before its first step."""
        device = self.transformer.device
        latents = initial_latents(job, self.channels, self.transformer.dtype, device)
        scheduler, timesteps = self._timesteps(latents.shape[0], job.steps, device)
        return DenoiseState(job, latents, scheduler, timesteps)

    @torch.no_grad()
    def step(self, states: list[DenoiseState]) -> None:
        """One transformer call advances every state by one of its own steps. States may be at
        different steps (each row gets its own timestep, each job keeps its own scheduler),
        which is what lets a job join a batch that is already running."""
        if len({(s.job.height, s.job.width) for s in states}) != 1:
            raise ValueError("jobs of one step must share height and width")
        dtype, device = self.transformer.dtype, self.transformer.device
        jobs = [s.job for s in states]
        latents = torch.stack([s.latents for s in states])
        cfg_rows = [i for i, job in enumerate(jobs) if job.cfg]
        text = [job.prompt_embeds for job in jobs] + [jobs[i].negative_embeds for i in cfg_rows]
        embeds, mask = pad_rows([t.to(device=device, dtype=dtype) for t in text])
        patch = VAE_SCALE_FACTOR * 2
        img_shapes = [[(1, jobs[0].height // patch, jobs[0].width // patch)]]
        t = torch.stack([s.timesteps[s.index] for s in states])
        rows = torch.cat([latents, latents[cfg_rows]])
        timestep = torch.cat([t, t[cfg_rows]]).to(dtype)
        pred = self.predict(
            rows, timestep / 1000, embeds, mask, img_shapes * rows.shape[0], len(jobs)
        )
        noise = pred[: len(jobs)].clone()
        if cfg_rows:
            scale = torch.tensor([jobs[i].true_cfg_scale for i in cfg_rows], dtype=dtype)
            scale = scale.to(device).view(-1, 1, 1)
            cond, uncond = noise[cfg_rows], pred[len(jobs) :]
            combined = uncond + scale * (cond - uncond)
            rescale = cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)
            noise[cfg_rows] = combined * rescale
        for state, velocity, t_i in zip(states, noise, t, strict=True):
            state.latents = state.scheduler.step(velocity, t_i, state.latents, return_dict=False)[0]
            state.index += 1

    @torch.no_grad()
    def run(self, jobs: list[ImageJob]) -> list[torch.Tensor]:
        """Packed latents [seq, C] per job, all started together. Stops between steps
        (DenoiseCancelled) once every job is cancelled; a batch with one job still wanted runs
        to the end."""
        if len({job.shape_key for job in jobs}) != 1:
            raise ValueError("jobs of one batch must share height, width and steps")
        states = [self.start(job) for job in jobs]
        if self.step_cache is not None:
            self.step_cache.begin(jobs[0].steps)
        for _ in range(jobs[0].steps):
            if self.cancelled(jobs):
                raise DenoiseCancelled(f"{len(jobs)} image(s) cancelled")
            self.step(states)
        if self.step_cache is not None:
            self.last_cached_steps = self.step_cache.cached_steps()
        return [s.latents.cpu() for s in states]  # the channel carries host tensors
