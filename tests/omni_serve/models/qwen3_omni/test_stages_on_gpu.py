"""The Qwen3-Omni torch stages on a GPU (what a stage that reserves one runs) give what they
give on the CPU, where they are golden-tested against transformers: the audio and vision
towers, Code2wav with its stream state, and the Talker with its code predictor and slot KV
cache. On the CPU every ``.to(device)`` is a no-op, so a tensor left on the wrong device shows
only here. Needs a CUDA GPU: skipped elsewhere (CI has none; the runs on a lent GPU are in the
issue notes)."""

from __future__ import annotations

import pytest
import torch

from omni_serve.engines.encoders.base import TorchEncoderEngine
from omni_serve.models.qwen3_omni.checkpoint import load_talker, load_thinker_embeddings
from omni_serve.models.qwen3_omni.codec import load_code2wav_decoder
from omni_serve.models.qwen3_omni.encoders import Qwen3OmniEncoders
from omni_serve.models.qwen3_omni.talker_inputs import TalkerInputBuilder
from tests.omni_serve.models.qwen3_omni.conftest import new_engine
from tests.omni_serve.models.qwen3_omni.test_code2wav_streams import codes, jobs_of
from tests.omni_serve.models.qwen3_omni.test_talker_runner import collect_codes, talker_request
from tests.reference import processor_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("exact_float32"),
]


@torch.no_grad()
def test_the_encoders_on_the_gpu_give_the_cpu_rows(tiny_omni_path, omni_processor):
    cpu, gpu = (Qwen3OmniEncoders(tiny_omni_path, device=d) for d in ("cpu", "cuda"))
    audio = processor_inputs(omni_processor, "audio")
    valid = audio["feature_attention_mask"][0].bool()
    features, lens = audio["input_features"][0][:, valid], valid.sum()[None]
    want = TorchEncoderEngine(cpu.encode_audio).encode_sync(
        input_features=features, feature_lens=lens
    )
    got = TorchEncoderEngine(gpu.encode_audio).encode_sync(
        input_features=features, feature_lens=lens
    )
    assert got.embeds.device.type == "cuda"
    torch.testing.assert_close(got.embeds.cpu(), want.embeds, atol=1e-4, rtol=1e-4)
    image = processor_inputs(omni_processor, "image")
    inputs = {"pixel_values": image["pixel_values"], "grid_thw": image["image_grid_thw"]}
    want = TorchEncoderEngine(cpu.encode_image).encode_sync(**inputs)
    got = TorchEncoderEngine(gpu.encode_image).encode_sync(**inputs)
    torch.testing.assert_close(got.embeds.cpu(), want.embeds, atol=1e-4, rtol=1e-4)
    assert len(got.deepstack) == len(want.deepstack) > 0
    for mine, theirs in zip(got.deepstack, want.deepstack, strict=True):
        torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)


def test_code2wav_on_the_gpu_decodes_the_cpu_waveform_chunk_by_chunk(tiny_omni_path):
    (cpu, context), (gpu, _) = (
        load_code2wav_decoder(tiny_omni_path, device=d) for d in ("cpu", "cuda")
    )
    stream = codes(120, seed=4)
    want = torch.cat(cpu.run(jobs_of(cpu, context, stream, "s")))
    chunks = gpu.run(jobs_of(gpu, context, stream, "s"))
    assert {c.device.type for c in chunks} == {"cpu"}  # waveforms leave on the host
    torch.testing.assert_close(torch.cat(chunks), want, atol=1e-4, rtol=0)
    assert (gpu.streams.hits, gpu.streams.misses) == (cpu.streams.hits, cpu.streams.misses)


async def test_the_talker_on_the_gpu_makes_the_cpu_codes(tiny_omni_path, reference_runs):
    """Greedy codes for a text and a mixed prompt: the transformers reference (CPU) frame for frame.
    Random tiny weights leave some logits close; a flip there would show as a late frame."""
    talker, config = load_talker(tiny_omni_path, device="cuda")
    builder = TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path))
    engine = new_engine((talker, builder))
    await engine.start()
    try:
        for kind in ("text", "mixed"):
            request, _ = talker_request(builder, reference_runs[kind], kind)
            got = await collect_codes(engine, request)
            assert got.device.type == "cpu"  # frames leave on the host for Code2wav
            assert torch.equal(got, reference_runs[kind].codes), kind
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
async def test_the_static_talker_step_as_cuda_graphs_gives_the_eager_steps_codes(
    tiny_omni_path, dtype
):
    """Replayed graphs (all captured up front; batch padded to a bucket, KV window rounded
    up to one) make the codes the same step makes eagerly on the GPU, greedy and seeded; in
    fp32 greedy they are transformers' codes too (test_talker_step.py holds that on the
    CPU)."""
    from omni_serve.engines.ar.base import SamplingConfig
    from omni_serve.engines.ar.step_graphs import batch_buckets, length_buckets
    from omni_serve.models.qwen3_omni.talker_static_runner import StaticTalkerRunner
    from tests.omni_serve.models.qwen3_omni.test_talker_step import GREEDY, SEEDED, engine_codes
    from tests.omni_serve.models.qwen3_omni.test_talker_step import requests as talker_requests

    talker, config = load_talker(tiny_omni_path, dtype=dtype, device="cuda")
    parts = (talker, TalkerInputBuilder(talker, config, load_thinker_embeddings(tiny_omni_path)))
    for sampling in (GREEDY, SEEDED, SamplingConfig(**{**SEEDED.__dict__, "top_p": 0.7})):

        def runner(mode: str) -> StaticTalkerRunner:
            return StaticTalkerRunner(talker, parts[1].tts_pad, 4, 256, graph_mode=mode)

        eager = await engine_codes(runner("eager"), talker_requests(parts, sampling))
        graphed_runner = runner("cuda_graph")
        captured = graphed_runner.capture()  # every bucket, on scratch rows, largest first
        assert captured == len(batch_buckets(4)) * len(length_buckets(256)) == 9
        graphed = await engine_codes(graphed_runner, talker_requests(parts, sampling))
        assert graphed == eager
        assert graphed_runner.graphs.captured == captured  # no capture in the middle of a reply
