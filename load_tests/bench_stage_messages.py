"""What the typed stage messages cost against the dicts they replaced, per handle call.

    .venv/bin/python load_tests/bench_stage_messages.py            # ~1.5 min

Two measures, both forms in the same run and on the same cores, back to back in each repeat
(which goes first alternates), with their per-repeat ratio as the verdict:
- serialization: Ray's cloudpickle dumps + loads of one Thinker request (a 200-token prompt,
  encoder rows as a channel ref), one Talker request (carrying it), one Thinker chunk and one
  codec frame (those two in their wire form, ``messages.to_wire``), in microseconds;
- a streaming Serve handle call: an echo deployment takes the request and streams back 8
  chunks, as the Thinker stage does; milliseconds per call, calls made one after another.

The dicts are the wire format the stages used before the messages (the same keys and
values). Writes docs/results/stage_messages.json (median and range over the repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import cloudpickle, serve

sys.path.insert(0, str(Path(__file__).parent))

from summary import spread, write_summary  # noqa: E402

from omni_serve.engines.ar.base import SamplingConfig  # noqa: E402
from omni_serve.models.thinker_talker.messages import (  # noqa: E402
    CodecFrame,
    SpeakRequest,
    ThinkerChunk,
    ThinkerRequest,
    from_wire,
    to_wire,
)
from omni_serve.transport.base import TensorRef  # noqa: E402

PROMPT = list(range(1000, 1200))
CHUNKS_PER_CALL = 8


def _ref() -> TensorRef:
    spec = {"rows": ("torch.float32", (80, 1024))}
    return TensorRef("shared_memory", "omni-bench-segment", 80 * 1024 * 4, spec, ("pool", 3))


def typed_messages() -> dict[str, Any]:
    thinker = ThinkerRequest(
        "chatcmpl-0123456789abcdef",
        PROMPT,
        SamplingConfig(max_tokens=256, temperature=0.7, top_p=0.9, seed=7),
        capture=True,
        session_id="session-1",
        audio_rows=_ref(),
    )
    return {
        "thinker_request": thinker,
        "speak_request": SpeakRequest(
            "chatcmpl-0123456789abcdef", thinker, PROMPT, "ethan", {}, audio_seqlens=[80]
        ),
        # Streamed items cross in their wire form (messages.to_wire), as the stages send them.
        "thinker_chunk": to_wire(ThinkerChunk([1234], " word", False, num_prompt_tokens=200)),
        "codec_frame": to_wire(CodecFrame(list(range(16)))),
    }


def dict_messages() -> dict[str, Any]:
    sampling = {
        "max_tokens": 256,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "seed": 7,
        "stop": [],
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logit_bias": None,
        "min_p": 0.0,
        "min_tokens": 0,
        "ignore_eos": False,
    }
    thinker = {
        "request_id": "chatcmpl-0123456789abcdef",
        "prompt_ids": PROMPT,
        "sampling": sampling,
        "capture": True,
        "session_id": "session-1",
        "session_kv": None,
        "cache_key": None,
        "audio_rows": _ref(),
    }
    return {
        "thinker_request": thinker,
        "speak_request": {
            "request_id": "chatcmpl-0123456789abcdef",
            "thinker": thinker,
            "prompt_ids": PROMPT,
            "voice": "ethan",
            "sampling": {},
            "image_grid_thw": None,
            "video_grid_thw": None,
            "video_second_per_grid": None,
            "audio_seqlens": [80],
            "reply_ids": None,
        },
        "thinker_chunk": {
            "kind": "text",
            "token_ids": [1234],
            "text": " word",
            "finished": False,
            "finish_reason": None,
            "stop_tokens": 0,
            "num_prompt_tokens": 200,
            "num_cached_tokens": 0,
            "prompt_token_ids": None,
        },
        "codec_frame": {"kind": "codes", "codes": list(range(16))},
    }


FORMS: dict[str, Callable[[], dict[str, Any]]] = {"dict": dict_messages, "typed": typed_messages}


def pickle_us(message: Any, loops: int) -> float:
    began = time.perf_counter()
    for _ in range(loops):
        cloudpickle.loads(cloudpickle.dumps(message))
    return (time.perf_counter() - began) / loops * 1e6


@serve.deployment(max_ongoing_requests=4)
class Echo:
    """A stage that takes a request and streams back chunks, as the Thinker does."""

    def generate(self, request: Any, chunk: Any):
        for _ in range(CHUNKS_PER_CALL):
            yield chunk


async def call_ms(handle: Any, request: Any, chunk: Any, calls: int) -> float:
    """Per call; a wire-form chunk is read back into its message, as the stages do."""
    stream = handle.options(stream=True)
    read = from_wire if isinstance(chunk, list) else None
    began = time.perf_counter()
    for _ in range(calls):
        async for item in stream.generate.remote(request, chunk):
            if read is not None:
                read(item)
    return (time.perf_counter() - began) / calls * 1e3


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300, help="handle calls per repeat")
    parser.add_argument("--loops", type=int, default=5000, help="pickle round trips per repeat")
    args = parser.parse_args()
    pickled: dict[str, dict[str, list[float]]] = {form: {} for form in FORMS}
    handled: dict[str, list[float]] = {form: [] for form in FORMS}
    handle = serve.run(Echo.bind(), name="bench-stage-messages", route_prefix=None)
    try:
        for make in FORMS.values():  # warm both paths (class registration, imports)
            messages = make()
            await call_ms(handle, messages["thinker_request"], messages["thinker_chunk"], 20)
        for repeat in range(args.repeats):
            # Alternate which form goes first: a machine that speeds up or slows down over the
            # run then favours neither.
            order = list(FORMS.items()) if repeat % 2 == 0 else list(FORMS.items())[::-1]
            for form, make in order:
                messages = make()
                for name, message in messages.items():
                    pickled[form].setdefault(name, []).append(pickle_us(message, args.loops))
                request, chunk = messages["thinker_request"], messages["thinker_chunk"]
                handled[form].append(await call_ms(handle, request, chunk, args.calls))
    finally:
        serve.delete("bench-stage-messages")
    figures: dict[str, Any] = {}
    for form in FORMS:
        figures[form] = {f"{name}_pickle_us": spread(v) for name, v in pickled[form].items()}
        figures[form]["handle_call_ms"] = spread(handled[form])
    # Per repeat, the two forms ran back to back: their ratio cancels the machine's drift.
    ratios = [typed / plain for typed, plain in zip(handled["typed"], handled["dict"], strict=True)]
    figures["typed_over_dict_handle_call"] = spread(ratios)
    sides = {"handle_call": f"one echo replica, {CHUNKS_PER_CALL} chunks streamed back per call"}
    path = write_summary("stage_messages", figures, sides, args.repeats)
    for form in FORMS:
        row = {k: round(v["median"], 1) for k, v in figures[form].items()}
        print(form, row)
    ratio = figures["typed_over_dict_handle_call"]
    print("typed/dict handle call:", {k: round(ratio[k], 3) for k in ("median", "min", "max")})
    print("wrote", path)


if __name__ == "__main__":
    asyncio.run(main())
