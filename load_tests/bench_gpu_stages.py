"""Our Qwen3-Omni speech stages against transformers' ``generate`` on the same device, in one
run: the Talker's decode step (eager runner, static step eager, static step as CUDA graphs,
static step compiled), Code2wav per chunk, and Talker + Code2wav from the Thinker's rows to
the waveform; and Qwen2.5-Omni's Talker step (``gpu_talker_qwen2_5.py``).

    python load_tests/bench_gpu_stages.py                  # a CUDA GPU; small-qwen3-omni
    python load_tests/bench_gpu_stages.py --quick          # CPU smoke run: tiny, batch 1, 2

Runs bare (torch and transformers; no Ray, no vLLM), as ``scripts/gpu_check.sh`` runs it.
A Talker step row counts everything the served step costs per frame: the eager runner's
step plus the engine's host sampling of codebook 0; the static step samples on the device.
Writes load_tests/results/bench_gpu_stages.json and prints a table;
``load_tests/gpu_stages_summary.py`` keeps that file as docs/results/gpu_stages.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_stages_table import print_table
from gpu_talker_qwen2_5 import bench_talker_step as bench_qwen2_5_talker_step
from speech_baseline import generate_speech, prompt_inputs  # load_tests/, beside this file
from summary import machine

import omni_serve  # noqa: F401  (torchvision compat before transformers)
from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.sampling import sample_one
from omni_serve.engines.codec.chunked import ChunkPlanner
from omni_serve.models import ensure_model
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from omni_serve.models.qwen3_omni.talker_runner import TalkerRunner
from omni_serve.models.qwen3_omni.talker_static_runner import StaticTalkerRunner

RESULTS = Path(__file__).parent / "results"
FRAME_S = 0.08  # 12.5 codec frames per second of audio
SAMPLING = SamplingConfig(temperature=0.9, top_k=50, repetition_penalty=1.05, max_tokens=1 << 20)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Talker:
    """One runner kind over a batch of live requests, stepped the way the engine steps it.
    Graphs are captured when the runner is built, before any request, as the served stage
    does: the buckets of ``rows`` up to the ``max_len`` window."""

    def __init__(self, parts, step: str, rows: int, max_batch: int, max_len: int):
        talker, self.builder = parts
        if step == "eager":
            self.runner = TalkerRunner(talker, self.builder.tts_pad, max_batch, max_len)
        else:
            mode = {"static": "eager", "cuda_graph": "cuda_graph", "compile": "compile"}[step]
            self.runner = StaticTalkerRunner(talker, self.builder.tts_pad, max_batch, max_len, mode)
        start = time.perf_counter()
        self.graphs = self.runner.capture([rows]) if step == "cuda_graph" else 0
        self.capture_s = time.perf_counter() - start
        self.states, self.generated = [], []

    def admit(self, batch: int) -> None:
        """Prefills ``batch`` requests (prompts of 40-55 rows, as the Thinker hands over)."""
        hidden, dtype = self.builder.tts_pad.shape[-1], self.builder.tts_pad.dtype
        for i in range(batch):
            embeds = torch.randn(40 + i % 16, hidden, dtype=dtype)
            request = ARRequest(
                str(i), prompt_embeds=embeds, sampling=SAMPLING, extra={"text_done": True}
            )
            state = self.runner.new_state(request)
            self.states.append(state)
            self.generated.append([self._token(state, self.runner.prefill(state), [])])

    def _token(self, state, out, generated: list[int]) -> int:
        if out.token is not None:
            return out.token
        suppress = self.runner.suppress_tokens(state)
        return sample_one(out.logits, SAMPLING, generated, suppress)

    def step(self) -> list[torch.Tensor]:
        outs = self.runner.decode(self.states, [g[-1] for g in self.generated])
        for state, out, generated in zip(self.states, outs, self.generated, strict=True):
            generated.append(self._token(state, out, generated))
        return [out.outputs["codes"] for out in outs]


def time_steps(talker: Talker, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):  # captures or compiles this bucket
        talker.step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        talker.step()
    sync()
    return (time.perf_counter() - start) / steps


def bench_talker(path, device, dtypes, kinds, batches, steps, compile_batches) -> list[dict]:
    """``compile`` rows only in bf16 and at ``compile_batches``: inductor takes minutes per
    shape for this step's unrolled graph."""
    rows = []
    for dtype in dtypes:
        talker, config = load_talker(path, dtype=getattr(torch, dtype), device=device)
        parts = (talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(path)))
        for kind in kinds:
            for batch in batches:
                if kind == "compile" and (dtype != "bfloat16" or batch not in compile_batches):
                    continue
                try:
                    run = Talker(parts, kind, batch, max(batches), 512)
                    run.admit(batch)
                    # The graphed rows are the targets: 3 windows, median and range; the
                    # eager ones are references, and 3 windows of them would not fit a call.
                    windows = 3 if kind in ("cuda_graph", "compile") else 1
                    times = [
                        time_steps(run, steps, warmup=3 if i == 0 else 0) for i in range(windows)
                    ]
                    step_s = statistics.median(times)
                    row = {
                        "ms": round(step_s * 1e3, 2),
                        "audio_s_per_s": batch * FRAME_S / step_s,
                        "ms_windows": [round(t * 1e3, 2) for t in times],
                    }
                    row["graphs"] = getattr(getattr(run.runner, "graphs", None), "captured", 0)
                    row["captured_before"] = run.graphs  # a capture while timed shows as more
                    row["capture_s"] = round(run.capture_s, 2)
                except Exception as exc:  # one failing mode must not hide the others
                    row = {"error": f"{type(exc).__name__}: {exc}"[:4000]}
                rows.append({"dtype": dtype, "step": kind, "batch": batch, **row})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def count_kernels(path, device, dtypes, batches) -> list[dict]:
    """Kernels one static step launches (what a graph replays), and the GPU time they take,
    from the torch profiler over one eager static step: where a launch-bound step goes."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    rows = []
    for dtype in dtypes:
        talker, config = load_talker(path, dtype=getattr(torch, dtype), device=device)
        parts = (talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(path)))
        for batch in batches:
            run = Talker(parts, "static", batch, batch, 256)
            run.admit(batch)
            time_steps(run, 1)
            cuda = device == "cuda"  # on a CPU (a smoke run): the leaf ops instead
            with profile(
                activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]
            ) as prof:
                run.step()
                sync()
            kernels = [
                e
                for e in prof.events()
                if (e.device_type.name == "CUDA" if cuda else not e.cpu_children)
            ]
            names = Counter(e.name[:60] for e in kernels)
            busy_ms = sum(e.device_time for e in kernels) / 1e3
            rows.append(
                {
                    "dtype": dtype,
                    "batch": batch,
                    "kernels": len(kernels),
                    "gpu_busy_ms": round(busy_ms, 2),
                    "top": names.most_common(12),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_code2wav(path, device, dtype, frames: int, batch: int = 1) -> dict:
    """Code2wav's chunk decode with ``batch`` streams' chunks in one call (as the served
    stage batches them): ms per call, normalized to 25-frame chunks. Flat in ``batch`` means
    launch-bound (graphs would help); linear means compute-bound."""
    decoder, context = load_code2wav_decoder(
        path, dtype=getattr(torch, dtype), max_batch=batch, device=device
    )
    gen = torch.Generator().manual_seed(0)
    streams = []
    for i in range(batch):
        planner = ChunkPlanner(
            decoder.samples_per_frame,
            first_chunk=2,
            chunk=25,
            left_context=context,
            stream_id=f"s{i}",
        )
        codes = torch.randint(0, 2048, (16, frames), generator=gen)
        streams.append(planner.push(codes) + [planner.finish()])
    rounds = [list(jobs) for jobs in zip(*streams, strict=True)]
    for jobs in rounds[:2]:  # warm-up: the first chunks
        decoder.run(jobs)
    times = []
    for jobs in rounds[2:]:
        sync()
        start = time.perf_counter()
        decoder.run(jobs)
        sync()
        times.append((time.perf_counter() - start) / jobs[0].num_frames * 25)
    return {
        "dtype": dtype,
        "batch": batch,
        "ms_per_25_frames": round(statistics.median(times) * 1e3, 2),
    }


def bench_end_to_end(path, device, dtype, step: str, batch: int, frames: int) -> dict:
    """From the Thinker's rows (the Talker's prompt) to waveforms: ``batch`` replies of
    ``frames`` frames, the Talker stepping them together and Code2wav decoding the chunks
    that fill at each step in one batch, as the served stages do, on one device. Timed the
    second time: the first loads every kernel and chunk shape this run meets."""
    talker, config = load_talker(path, dtype=getattr(torch, dtype), device=device)
    parts = (talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(path)))
    decoder, context = load_code2wav_decoder(
        path, dtype=getattr(torch, dtype), max_batch=batch, device=device
    )
    for _ in range(2):
        run = Talker(parts, step, batch, batch, frames + 64)  # graphs captured here, untimed
        sync()
        start = time.perf_counter()
        samples = speak(run, decoder, context, batch, frames)
        sync()
        wall = time.perf_counter() - start
    audio = samples / 24_000
    return {
        "dtype": dtype,
        "step": step,
        "batch": batch,
        "frames": frames,
        "wall_s": wall,
        "audio_s": audio,
        "audio_s_per_s": audio / wall,
    }


def speak(run: Talker, decoder, context: int, batch: int, frames: int) -> int:
    """Admits ``batch`` replies and speaks ``frames`` frames of each; the samples made."""
    run.admit(batch)
    planners = [
        ChunkPlanner(decoder.samples_per_frame, 2, 25, context, stream_id=str(i))
        for i in range(batch)
    ]
    samples = 0
    for _ in range(frames):
        frames_now = run.step()
        jobs = [
            job for p, f in zip(planners, frames_now, strict=True) for job in p.push(f[:, None])
        ]
        samples += sum(w.numel() for w in decoder.run(jobs))
    samples += sum(w.numel() for w in decoder.run([p.finish() for p in planners]))
    return samples


def bench_transformers(path, device, dtype, text_tokens: int, frames: int, repeats: int) -> dict:
    from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

    from omni_serve.compat.transformers import qwen3_omni_talker_audio_config

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    qwen3_omni_talker_audio_config(model.talker, model.config.thinker_config)
    processor = AutoProcessor.from_pretrained(path)
    inputs = prompt_inputs(processor, "Tell me a story.").to(device)

    def once() -> tuple[float, float]:
        torch.manual_seed(0)
        sync()
        start = time.perf_counter()
        wav = generate_speech(model, processor, inputs, text_tokens, frames)
        sync()
        return time.perf_counter() - start, wav.shape[-1] / 24_000

    once()
    runs = [once() for _ in range(repeats)]
    walls = [w for w, _ in runs]
    return {
        "dtype": dtype,
        "e2e_s": statistics.median(walls),
        "e2e_range_s": [min(walls), max(walls)],
        "e2e_values_s": walls,
        "audio_s": runs[0][1],
        "repeats": repeats,
    }


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"  # a lent machine gets the tree without .git


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--quick", action="store_true", help="CPU smoke run: tiny model, small sizes"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--compile-batches",
        default="1",
        help="batches of the bf16 torch.compile rows on a GPU ('' for none)",
    )
    parser.add_argument(
        "--kinds", default="", help="Talker step kinds to time, e.g. 'cuda_graph' (default all)"
    )
    parser.add_argument(
        "--sections", default="", help="sections to run, e.g. 'talker_step,end_to_end' (all)"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = "tiny-qwen3-omni" if args.quick else "small-qwen3-omni"
    batches = [1, 2] if args.quick else [1, 16, 64, 128]
    kinds = ["eager", "static"] + (["cuda_graph", "compile"] if cuda else [])
    kinds = [k for k in kinds if k in args.kinds.split(",")] if args.kinds else kinds
    compile_batches = {int(b) for b in args.compile_batches.split(",") if b}
    frames = 12 if args.quick else 100
    path = ensure_model(model)
    torch.set_num_threads(1 if not cuda else torch.get_num_threads())
    summary = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "model": model,
        "threads": torch.get_num_threads(),
        "machine": machine(),
    }
    print(json.dumps(summary), flush=True)
    best = "cuda_graph" if cuda else "static"
    dtypes = ("float32", "bfloat16")
    shapes = [(k, b) for k, b in (("eager", 1), (best, 1), (best, batches[-2])) if k in kinds]
    steps = 2 if args.quick else args.steps
    eager_kinds = [k for k in kinds if k != "compile"]
    sections = {  # cheapest and most asked-for first; compiling (minutes) last
        "talker_step": lambda: bench_talker(
            path, device, dtypes, eager_kinds, batches, steps, set()
        ),
        "end_to_end": lambda: [
            bench_end_to_end(path, device, d, s, b, frames) for d in dtypes for s, b in shapes
        ],
        "code2wav": lambda: [
            bench_code2wav(path, device, d, frames, b) for d in dtypes for b in (1, batches[-2])
        ],
        "kernels": lambda: count_kernels(path, device, dtypes, [1, batches[-2]]),
        "transformers": lambda: [
            bench_transformers(path, device, d, 32, frames, 1 if args.quick else 3) for d in dtypes
        ],
        "qwen2_5_talker_step": lambda: bench_qwen2_5_talker_step(
            device, args.quick, [k for k in eager_kinds if k != "compile"], steps
        ),
        "talker_step_compiled": lambda: bench_talker(
            path,
            device,
            ("bfloat16",),
            ["compile"] if cuda else [],
            batches,
            steps,
            compile_batches,
        ),
    }
    RESULTS.mkdir(exist_ok=True)
    chosen = args.sections.split(",") if args.sections else list(sections)
    for name, run in sections.items():  # written after each: a timeout keeps what finished
        if name not in chosen:
            continue
        summary[name] = run()
        print(json.dumps(summary[name]), flush=True)
        (RESULTS / "bench_gpu_stages.json").write_text(json.dumps(summary, indent=1))
    print_table(summary)


if __name__ == "__main__":
    main()
