"""A stage's engine settings, and what each kind of stage does with them.

Every field must do what it says or be refused when the config loads: a setting a stage
silently ignores (a ``talker`` asking for vLLM, a batch size on a stage that does not batch,
a dtype that never reaches vLLM) is how a GPU profile ends up loading a 30B model in float32.
``STAGE_ENGINES`` says, per stage kind, which engines run it and which settings it reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from omni_serve.config.diffusion import DiTParallelSettings, StepCacheSettings

StageKind = Literal[
    "encoder", "thinker", "talker", "code2wav", "text_encoder", "dit", "vae", "ingress"
]
EngineKind = Literal["vllm", "torch", "diffusers"]


class EngineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: EngineKind = Field(description="Which engine implementation runs the stage.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine arguments: vLLM AsyncEngineArgs fields for a vLLM stage (except "
        "those with a field of their own here), the stage's own arguments for the others.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights and activations dtype (float32 on CPU)."
    )
    max_batch_size: int = Field(
        8,
        ge=1,
        description="Most requests the engine steps together (continuous batching; vLLM's "
        "max_num_seqs). Only for stages that batch.",
    )
    cuda_graphs: bool = Field(
        False,
        description="Run decode steps as CUDA graphs (needs a GPU): the Talker's static-shape "
        "step captured per batch and KV-window bucket; vLLM's graphs for the Thinker (off: "
        "enforce_eager).",
    )
    step_cache: StepCacheSettings | None = Field(
        None, description="DiT stages: cache-dit step caching (off when unset)."
    )
    parallel: DiTParallelSettings | None = Field(
        None, description="DiT stages: denoise on several workers with xfuser (one when unset)."
    )
    batching: Literal["auto", "request", "step"] = Field(
        "auto",
        description="DiT stages: 'step' re-forms the batch before every denoising step (a new "
        "request joins at the next step, one that finishes leaves); 'request' batches requests "
        "that arrive together and runs them to the end; 'auto' is 'step' unless step_cache or "
        "parallel needs 'request'.",
    )

    @property
    def step_batching(self) -> bool:
        """Whether the DiT batches per step (see ``batching``)."""
        return self.batching == "step" or (self.batching == "auto" and not self._per_batch())

    def _per_batch(self) -> bool:
        # cache-dit decides per transformer call whether a step is cached, for the whole batch;
        # parallel workers would each have to agree on every join and leave.
        cache = self.step_cache is not None and self.step_cache.enabled
        return cache or (self.parallel is not None and self.parallel.world_size > 1)

    @model_validator(mode="after")
    def _step_batching_alone(self) -> EngineSettings:
        if self.batching == "step" and self._per_batch():
            raise ValueError("batching 'step' cannot be combined with step_cache or parallel")
        return self

    @model_validator(mode="after")
    def _parallel_without_step_cache(self) -> EngineSettings:
        # Each worker's cache-dit would decide on its own slice whether to skip a step, and
        # workers that disagree wait on each other's collectives forever.
        parallel = self.parallel is not None and self.parallel.world_size > 1
        if parallel and self.step_cache is not None and self.step_cache.enabled:
            raise ValueError("step_cache and parallel cannot be combined on one DiT stage")
        return self

    def vllm_args(self) -> dict[str, Any]:
        """What a vLLM stage's engine receives: its args with the dedicated fields applied."""
        return {
            **self.args,
            "dtype": self.dtype,
            "max_num_seqs": self.max_batch_size,
            "enforce_eager": not self.cuda_graphs,
        }


@dataclass(frozen=True)
class StageEngine:
    """What one kind of stage reads of its engine settings."""

    kinds: tuple[str, ...]  # engines that run it; () = no engine
    args: frozenset[str] | None = frozenset()  # args it reads; None = passed to vLLM
    batches: bool = False  # reads max_batch_size
    cuda_graphs: bool = False
    dit: bool = False  # reads step_cache, parallel and batching


STAGE_ENGINES: dict[str, StageEngine] = {
    "ingress": StageEngine(kinds=()),
    "encoder": StageEngine(("torch",), frozenset({"cache_mib"})),
    "thinker": StageEngine(("vllm",), None, batches=True, cuda_graphs=True),
    "talker": StageEngine(
        ("torch",), frozenset({"max_new_tokens", "max_model_len"}), batches=True, cuda_graphs=True
    ),
    "code2wav": StageEngine(
        ("torch",), frozenset({"first_chunk_frames", "chunk_frames", "chunk_growth"}), batches=True
    ),
    "text_encoder": StageEngine(("torch",)),
    "dit": StageEngine(("diffusers",), batches=True, dit=True),
    "vae": StageEngine(("diffusers",)),
}

# A codec stage's args by family, where the family's codec is not Qwen3-Omni's Code2wav:
# Qwen2.5-Omni's Token2Wav (a DiT and a vocoder) takes its ODE, guidance and block context.
FAMILY_STAGE_ARGS: dict[tuple[str, str], frozenset[str]] = {
    ("qwen2_5_omni", "code2wav"): frozenset(
        {
            "num_steps",
            "guidance_scale",
            "sway_coefficient",
            "left_blocks",
            "right_blocks",
            "first_right_blocks",
            "first_chunk_blocks",
            "chunk_blocks",
            "chunk_growth",
            "noise_seed",
        }
    ),
}

# The stage kinds each family's graph has.
FAMILY_STAGE_KINDS: dict[str, frozenset[str]] = {
    "qwen3_omni": frozenset({"ingress", "encoder", "thinker", "talker", "code2wav"}),
    "qwen2_5_omni": frozenset({"ingress", "encoder", "thinker", "talker", "code2wav"}),
    "qwen_image": frozenset({"ingress", "text_encoder", "dit", "vae"}),
}

# vLLM args that have a field of their own: one place to set each.
VLLM_DEDICATED_ARGS = {
    "dtype": "dtype",
    "max_num_seqs": "max_batch_size",
    "enforce_eager": "cuda_graphs",
}


def check_stage_engine(
    name: str, kind: str, engine: EngineSettings | None, num_gpus: float, family: str = ""
) -> None:
    """Raise ValueError naming the stage and the field when ``engine`` asks for something the
    stage would not do."""
    spec = STAGE_ENGINES[kind]
    if family in FAMILY_STAGE_KINDS and kind not in FAMILY_STAGE_KINDS[family]:
        has = ", ".join(sorted(FAMILY_STAGE_KINDS[family]))
        raise ValueError(
            f"stage {name!r}: family {family!r} has no {kind} stage (its stages: {has}); "
            "remove the stage and its edges"
        )
    if (family, kind) in FAMILY_STAGE_ARGS:
        spec = dataclasses.replace(spec, args=FAMILY_STAGE_ARGS[family, kind])
    a_stage = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} stage"

    def refuse(field: str, why: str) -> None:
        raise ValueError(f"stage {name!r}: engine.{field}: {why}")

    if engine is None:
        if spec.kinds:
            raise ValueError(f"stage {name!r}: {a_stage} needs an engine ({spec.kinds[0]})")
        return
    if engine.kind not in spec.kinds:
        runs = f"runs on {' or '.join(spec.kinds)}" if spec.kinds else "has no engine"
        refuse("kind", f"{a_stage} {runs}, not {engine.kind}")
    # Fields away from their defaults: a config the deployments receive is a dump of the
    # validated one, with every field written out, so "set" cannot mean "present".
    given = {
        f
        for f, info in EngineSettings.model_fields.items()
        if getattr(engine, f) != info.get_default(call_default_factory=True)
    }
    if spec.args is None:
        for arg, field in VLLM_DEDICATED_ARGS.items():
            if arg in engine.args:
                refuse(f"args.{arg}", f"set engine.{field} instead")
    else:
        for arg in sorted(set(engine.args) - spec.args):
            takes = ", ".join(sorted(spec.args)) or "none"
            refuse(f"args.{arg}", f"not an argument of {a_stage} (it takes: {takes})")
    if "max_batch_size" in given and not spec.batches:
        refuse("max_batch_size", f"{a_stage} does not batch")
    if engine.cuda_graphs and not spec.cuda_graphs:
        refuse("cuda_graphs", f"{a_stage} has no graphed step")
    if engine.cuda_graphs and num_gpus <= 0:
        refuse("cuda_graphs", "needs a GPU (deployment.ray_actor_options.num_gpus > 0)")
    for field in ("step_cache", "parallel", "batching"):
        if field in given and not spec.dit:
            refuse(field, "for DiT stages only")
