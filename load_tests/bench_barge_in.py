"""Barge-in on the audio WebSocket: how soon a spoken answer the client cancels stops, for the
client and in the stages, against the work the uncut answer had left at that moment.

    .venv/bin/python load_tests/bench_barge_in.py [--rounds 5] [--listen-s 0.5]

Serves the tiny Qwen3-Omni graph (``graphs.qwen3_omni:app``). Each round asks one long spoken
answer twice over the WebSocket, in turn: ``uncut`` runs to its end; ``cut`` is cancelled
(``response.cancel``) ``--listen-s`` after its first audio frame, as a user who talks over the
reply. Measured from the cancel: the ``response.done`` with ``status: cancelled`` (what the
client waits for), and the Talker and Code2wav having no request running (``/metrics``, polled
every 20 ms: the work stopped). The reference is what the uncut answer had left at the same
point (its end, less its first frame and the same listening time). Writes
``load_tests/results/bench_barge_in.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import websockets

sys.path.insert(0, str(Path(__file__).parents[1]))
from omni_serve.testing.serve_process import ServeProcess  # noqa: E402
from omni_serve.testing.served_metrics import is_fresh  # noqa: E402

URL = "http://127.0.0.1:8000"
WS_URL = "ws://127.0.0.1:8000/v1/audio/stream"
RESULTS = Path(__file__).parent / "results"
CHAT = {
    "type": "chat",
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "max_tokens": 200,
    "temperature": 0,
    "stage_overrides": {"talker": {"max_tokens": 500, "temperature": 0}},
}
RUNNING = (
    'omni_stage_running_requests{stage="talker"}',
    'omni_stage_running_requests{stage="code2wav"}',
)


def stages_busy() -> float:
    """The Talker's and Code2wav's running requests (at least 1 while a stage's count is
    an old one: it did not answer the scrape)."""
    text = httpx.get(f"{URL}/metrics", timeout=30).text
    running = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(RUNNING))
    stale = not (is_fresh(text, "talker") and is_fresh(text, "code2wav"))
    return max(running, float(stale))


async def until_idle() -> float:
    while await asyncio.to_thread(stages_busy):
        await asyncio.sleep(0.02)
    return time.perf_counter()


async def one_answer(ws, cut_after_s: float | None) -> dict[str, float]:
    """Seconds from the request; with ``cut_after_s``, cancelled that long after the first
    audio frame."""
    start = time.perf_counter()
    await ws.send(json.dumps(CHAT))
    first = cancel = None
    bytes_after_cancel = 0
    while True:
        frame = await ws.recv()
        now = time.perf_counter()
        if isinstance(frame, bytes):
            first = first or now
            bytes_after_cancel += len(frame) if cancel else 0
            if cut_after_s is not None and cancel is None and now - first >= cut_after_s:
                cancel = time.perf_counter()
                await ws.send(json.dumps({"type": "response.cancel"}))
            continue
        event = json.loads(frame)
        if event["type"] in ("response.done", "error"):
            break
    assert event.get("status") == ("cancelled" if cut_after_s is not None else "completed"), event
    out = {"first_audio_s": first - start, "end_s": now - start}
    if cancel is not None:
        idle = await until_idle()
        out |= {
            "cancel_s": cancel - start,
            "cancel_to_done_ms": (now - cancel) * 1000,
            "cancel_to_idle_ms": (idle - cancel) * 1000,
            "audio_bytes_after_cancel": bytes_after_cancel,
        }
    return out


async def rounds(n: int, listen_s: float) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {"uncut": [], "cut": []}
    async with websockets.connect(WS_URL, max_size=None) as ws:
        await one_answer(ws, None)  # warm-up
        for _ in range(n):
            runs["uncut"].append(await one_answer(ws, None))
            runs["cut"].append(await one_answer(ws, listen_s))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--listen-s", type=float, default=0.5)
    args = parser.parse_args()
    server = ServeProcess("graphs.qwen3_omni:app", URL)
    server.start()
    try:
        runs = asyncio.run(rounds(args.rounds, args.listen_s))
    finally:
        server.stop()
    left = [u["end_s"] - u["first_audio_s"] - args.listen_s for u in runs["uncut"]]
    idle = [c["cancel_to_idle_ms"] / 1000 for c in runs["cut"]]
    summary = {
        "rounds": args.rounds,
        "listen_s": args.listen_s,
        "median_cancel_to_done_ms": statistics.median(c["cancel_to_done_ms"] for c in runs["cut"]),
        "median_cancel_to_idle_ms": statistics.median(idle) * 1000,
        "median_uncut_left_s": statistics.median(left),
        "work_left_over_stop_time": statistics.median(left) / statistics.median(idle),
        "max_audio_bytes_after_cancel": max(c["audio_bytes_after_cancel"] for c in runs["cut"]),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_barge_in.json"
    out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
