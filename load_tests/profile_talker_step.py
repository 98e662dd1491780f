"""Time (and optionally profile) one batched Talker decode step in isolation.

    .venv/bin/python load_tests/profile_talker_step.py 16          # ms per step at batch 16
    .venv/bin/python load_tests/profile_talker_step.py 16 --prof   # + torch profiler table
    .venv/bin/python load_tests/profile_talker_step.py 16 --step static [--graph-mode compile]
    .venv/bin/python load_tests/profile_talker_step.py 16 --repeats 5   # both, interleaved

The eager runner's step leaves sampling codebook 0 to the engine (on the host, per row), so
its time here excludes that; the static step's includes it (on the device).

small-qwen3-omni, 1 torch thread, the served KV cache length (4096), sampled Talker and code
predictor as served. Prints ms per step and the audio seconds per second that step rate makes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.models import ensure_model
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.models.qwen3_omni.talker_static_runner import StaticTalkerRunner

FRAME_SECONDS = 0.08  # 12.5 codec frames per second of audio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("batch", type=int, nargs="?", default=16)
    parser.add_argument("--prof", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="timed windows of --steps each")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--step",
        default="both",
        choices=["eager", "static", "both"],
        help="the eager TalkerRunner, the static-shape TalkerDecodeStep, or both interleaved",
    )
    parser.add_argument(
        "--graph-mode",
        default="eager",
        choices=["eager", "compile"],
        help="with --step static: run it eagerly or torch.compile'd",
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    path = ensure_model("small-qwen3-omni")
    talker, config = load_talker(path, dtype=dtype)
    builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(path))
    kinds = ["eager", "static"] if args.step == "both" else [args.step]
    runs = {kind: Batch(talker, builder, kind, args) for kind in kinds}
    if args.prof:
        from torch.profiler import ProfilerActivity, profile

        for kind, run in runs.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run.steps(10)
            print(kind, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    windows: dict[str, list[float]] = {kind: [] for kind in runs}
    for _ in range(args.repeats):  # interleaved: both see the same machine
        for kind, run in runs.items():
            start = time.perf_counter()
            run.steps(args.steps)
            windows[kind].append((time.perf_counter() - start) / args.steps * 1000)
    for kind, times in windows.items():
        step = statistics.median(times)
        rate = args.batch * FRAME_SECONDS / step * 1000
        spread = f" (range {min(times):.1f}-{max(times):.1f}, {args.repeats} windows)"
        mode = args.graph_mode if kind == "static" else "eager"
        print(
            f"batch {args.batch} ({kind}, {mode}, {args.dtype}): "
            f"{step:.1f} ms per step{spread if args.repeats > 1 else ''}, "
            f"{rate:.2f} audio s/s"
        )


class Batch:
    """``args.batch`` live requests on one runner, prefilled and warmed up."""

    def __init__(self, talker, builder, kind: str, args) -> None:
        size = max(16, args.batch)
        if kind == "static":
            self.runner = StaticTalkerRunner(
                talker,
                builder.tts_pad,
                max_batch_size=size,
                max_len=4096,
                graph_mode=args.graph_mode,
            )
        else:
            self.runner = TalkerRunner(talker, builder.tts_pad, max_batch_size=size, max_len=4096)
        hidden, dtype = builder.tts_pad.shape[-1], builder.tts_pad.dtype
        sampling = SamplingConfig(temperature=0.9, top_k=50)
        self.states = []
        for i in range(args.batch):
            embeds = torch.randn(40 + i, hidden, dtype=dtype)
            request = ARRequest(
                str(i), prompt_embeds=embeds, sampling=sampling, extra={"text_done": True}
            )
            state = self.runner.new_state(request)
            self.runner.prefill(state)
            self.states.append(state)
        self.last = [5] * args.batch
        self.steps(3)  # with --graph-mode compile, the first compiles

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.runner.decode(self.states, self.last)


if __name__ == "__main__":
    main()
