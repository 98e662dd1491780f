"""``bench_gpu_stages.py``'s Qwen2.5-Omni section: its Talker's decode step per kind (the eager
runner, the static step eager, as CUDA graphs) at each batch, on small-qwen2-5-omni (or the
tiny preset in a quick run). The eager row includes the engine's host sampling, as served; the
static step samples on the device. 50 codes make a second of audio."""

from __future__ import annotations

import statistics
import time

import torch

from omni_serve.engines.ar.base import ARRequest, SamplingConfig
from omni_serve.engines.ar.sampling import sample_one
from omni_serve.models import ensure_model
from omni_serve.models.qwen2_5_omni.checkpoint import load_talker
from omni_serve.models.qwen2_5_omni.talker_runner import TalkerRunner
from omni_serve.models.qwen2_5_omni.talker_static_runner import StaticTalkerRunner

CODE_S = 0.02  # 50 codec tokens per second of audio
SAMPLING = SamplingConfig(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Talker:
    """One runner kind over ``batch`` live requests (prompts of 40-55 rows), stepped as the
    engine steps it; graphs captured before any request, as the served stage does."""

    def __init__(self, talker, kind: str, batch: int, max_batch: int, max_len: int) -> None:
        hidden = talker.thinker_to_talker_proj.in_features
        pad_row = torch.zeros(hidden, dtype=talker.codec_head.weight.dtype)
        if kind == "eager":
            self.runner = TalkerRunner(talker, pad_row, max_batch, max_len)
        else:
            mode = {"static": "eager", "cuda_graph": "cuda_graph"}[kind]
            self.runner = StaticTalkerRunner(talker, pad_row, max_batch, max_len, mode)
        start = time.perf_counter()
        self.graphs = self.runner.capture([batch]) if kind == "cuda_graph" else 0
        self.capture_s = time.perf_counter() - start
        self.states, self.tokens = [], []
        for i in range(batch):
            embeds = torch.randn(40 + i % 16, hidden, dtype=pad_row.dtype)
            request = ARRequest(
                str(i), prompt_embeds=embeds, sampling=SAMPLING, extra={"text_done": True}
            )
            state = self.runner.new_state(request)
            self.states.append(state)
            self.tokens.append([self._token(state, self.runner.prefill(state))])

    def _token(self, state, out) -> int:
        if out.token is not None:
            return out.token
        return sample_one(out.logits, SAMPLING, [], self.runner.suppress_tokens(state))

    def step(self) -> None:
        outs = self.runner.decode(self.states, [t[-1] for t in self.tokens])
        for state, out, tokens in zip(self.states, outs, self.tokens, strict=True):
            tokens.append(self._token(state, out))


def bench_talker_step(device: str, quick: bool, kinds: list[str], steps: int) -> list[dict]:
    model = "tiny-qwen2-5-omni" if quick else "small-qwen2-5-omni"
    path = ensure_model(model)
    batches = [1, 2] if quick else [1, 16, 64]
    rows = []
    for dtype in ("float32", "bfloat16"):
        talker, _ = load_talker(path, dtype=getattr(torch, dtype), device=device)
        for kind in kinds:
            for batch in batches:
                try:
                    run = Talker(talker, kind, batch, max(batches), 512)
                    times = []
                    for window in range(3 if kind == "cuda_graph" else 1):
                        for _ in range(3 if window == 0 else 0):  # warm-up
                            run.step()
                        _sync()
                        start = time.perf_counter()
                        for _ in range(steps):
                            run.step()
                        _sync()
                        times.append((time.perf_counter() - start) / steps)
                    step_s = statistics.median(times)
                    row = {
                        "ms": round(step_s * 1e3, 2),
                        "audio_s_per_s": batch * CODE_S / step_s,
                        "ms_windows": [round(t * 1e3, 2) for t in times],
                        "captured_before": run.graphs,
                        "capture_s": round(run.capture_s, 2),
                    }
                except Exception as exc:  # one failing mode must not hide the others
                    row = {"error": f"{type(exc).__name__}: {exc}"[:4000]}
                rows.append({"model": model, "dtype": dtype, "step": kind, "batch": batch, **row})
    return rows
