"""Multi-turn conversations whose turns land on either of two Thinker replicas: the time to the
first token of turns 2 and 3 with the session KV handover, against the same without it.

    .venv/bin/python load_tests/bench_sessions.py [--conversations 12] [--words 280]
    .venv/bin/python load_tests/bench_sessions.py --voice --conversations 4

Serves ``load_tests/configs/qwen3_omni_sessions_pipeline.yaml`` (small-qwen3-omni, two Thinker
replicas behind Serve's default router, the ``session_kv`` edge on). Conversations run in
pairs, one request at a time, turns interleaved: ``handover`` sends a ``session_id`` (each turn
exports its prompt's KV, the next turn loads it on whichever replica it lands), ``local`` does
not (a turn finds its prefix only in the prefix cache of the replica it lands on). Each
conversation has its own random ~1,500-token system prompt, so nothing is shared between them.
Turn 1 is a full prefill in both groups: the reference. The ratio compares the mean time to
first token of turns 2-3 (the misses are what the handover removes; a median hides them when
most turns land where their prefix is). Writes
``load_tests/results/bench_sessions.json``.

``--voice``: a voice chat instead: every user turn carries a 1.5 s clip (which the encoder
stage encodes) and asks for a spoken reply, so every turn captures the Thinker's rows for the
Talker. Without a session such a turn reads no cache at all; with one it reads caches where
the rows its session kept cover them. Writes ``load_tests/results/bench_sessions_voice.json``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).parents[1]))
from omni_serve.testing.serve_process import ServeProcess  # noqa: E402

URL = "http://127.0.0.1:8000"
PIPELINE = "load_tests/configs/qwen3_omni_sessions_pipeline.yaml"
RESULTS = Path(__file__).parent / "results"
WORDS = [
    "river",
    "stone",
    "light",
    "paper",
    "cloud",
    "garden",
    "window",
    "market",
    "silver",
    "winter",
    "morning",
    "letter",
    "forest",
    "bridge",
    "orange",
    "candle",
    "harbor",
    "mountain",
    "pocket",
    "thunder",
    "violet",
    "meadow",
    "anchor",
    "lantern",
    "pebble",
    "saddle",
    "copper",
    "ribbon",
    "whisper",
    "canyon",
    "velvet",
]
TURNS = ("Name a colour.", "And another one?", "One more, please.")


def system_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


SPOKEN = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}


def clip(rng: random.Random) -> dict:
    """A 1.5 s tone of a random pitch, as an input_audio part."""
    t = np.arange(24000) / 16000
    wave = (0.3 * np.sin(2 * np.pi * rng.uniform(200, 800) * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, wave, 16000, format="WAV", subtype="FLOAT")
    data = base64.b64encode(buf.getvalue()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def ask(client: httpx.Client, messages: list[dict], session: str | None, voice: bool) -> dict:
    body = {"model": "qwen3-omni", "messages": messages, "max_tokens": 4, "temperature": 0.0}
    if voice:
        body |= SPOKEN
    if session:
        body["session_id"] = session
    response = client.post(f"{URL}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    data = response.json()
    return {
        "first_token_s": data["timings"]["first_token_s"],
        "prompt_tokens": data["usage"]["prompt_tokens"],
        "cached_tokens": data["usage"]["prompt_tokens_details"]["cached_tokens"],
        "reply": data["choices"][0]["message"]["content"],
    }


def run(conversations: int, words: int, voice: bool = False) -> dict[str, list[list[dict]]]:
    rng = random.Random(0)
    groups: dict[str, list[list[dict]]] = {"handover": [], "local": []}
    with httpx.Client() as client:
        for i in range(conversations):
            chats = {
                name: [{"role": "system", "content": system_prompt(rng, words)}] for name in groups
            }
            turns: dict[str, list[dict]] = {name: [] for name in groups}
            for question in TURNS:
                content = [clip(rng), {"type": "text", "text": question}] if voice else question
                for name, messages in chats.items():
                    messages.append({"role": "user", "content": content})
                    session = f"bench-{i}" if name == "handover" else None
                    turn = ask(client, messages, session, voice)
                    messages.append({"role": "assistant", "content": turn.pop("reply")})
                    turns[name].append(turn)
            for name in groups:
                groups[name].append(turns[name])
            print(f"conversation {i + 1}/{conversations}", flush=True)
    return groups


def summarize(conversations: list[list[dict]]) -> dict:
    first = [c[0] for c in conversations]
    later = [t for c in conversations for t in c[1:]]
    ttft = [t["first_token_s"] for t in later]
    with_prefix = [t["first_token_s"] for t in later if t["cached_tokens"] > 0]
    without = [t["first_token_s"] for t in later if t["cached_tokens"] == 0]
    return {
        "turn1_first_token_s_p50": statistics.median(t["first_token_s"] for t in first),
        "later_first_token_s_mean": statistics.mean(ttft),
        "later_first_token_s_p50": statistics.median(ttft),
        "later_first_token_s_p90": sorted(ttft)[int(0.9 * (len(ttft) - 1))],
        "later_with_prefix_first_token_s_p50": statistics.median(with_prefix)
        if with_prefix
        else None,
        "later_without_prefix_first_token_s_p50": statistics.median(without) if without else None,
        "later_cached_fraction_mean": statistics.mean(
            t["cached_tokens"] / t["prompt_tokens"] for t in later
        ),
        "later_turns_with_prefix": sum(t["cached_tokens"] > 0 for t in later) / len(later),
        "prompt_tokens_p50": statistics.median(t["prompt_tokens"] for t in later),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--words", type=int, default=280, help="system prompt length in words")
    parser.add_argument("--voice", action="store_true", help="audio in, speech out")
    args = parser.parse_args()
    server = ServeProcess("graphs.qwen3_omni:build_app", URL, (f"pipeline_config={PIPELINE}",))
    started = time.perf_counter()
    server.start(timeout_s=600)
    print(f"server ready in {time.perf_counter() - started:.0f}s", flush=True)
    try:
        run(2, 200, args.voice)  # warm-up, not counted
        groups = run(args.conversations, args.words, args.voice)
    finally:
        server.stop()
    summary = {name: summarize(conversations) for name, conversations in groups.items()}
    handover, local = summary["handover"], summary["local"]
    summary["later_ttft_mean_ratio_handover_vs_local"] = (
        handover["later_first_token_s_mean"] / local["later_first_token_s_mean"]
    )
    summary["config"] = {"pipeline": PIPELINE, **vars(args)}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("bench_sessions_voice.json" if args.voice else "bench_sessions.json")
    out.write_text(json.dumps({"summary": summary, "turns": groups}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
