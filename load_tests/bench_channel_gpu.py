"""GPU tensor channel benchmark: a payload on one process's GPU to another process's GPU, by
the direct backend (GPU to GPU) and by the host path every other backend takes, against a
device-to-device copy in the same run.

    python load_tests/bench_channel_gpu.py     # needs a CUDA GPU and NIXL; ~1 min

A round: the producer (this process) puts a float32 tensor that lives on its GPU and sends
the ref over a pipe; the consumer (a spawned process with the same GPU) takes it, makes sure
it is on its GPU (``.to("cuda")``: a no-op for direct), synchronizes and answers. Paths:
- ``direct``: ``DirectChannel``: one device copy into a registered VRAM buffer, then the
  consumer reads it into its own GPU memory (UCX: CUDA IPC on one host, GPUDirect RDMA
  between hosts).
- ``host``: ``SharedMemoryChannel`` (what auto picks for host tensors on one host; the object
  store and inline also go through host memory): device to host into a segment, then host to
  device in the consumer.
- ``d2d``: one device-to-device copy of the same size inside the producer: the reference.
Added latency = round minus an empty round (the same pipe exchange without a payload), medians.
Writes load_tests/results/bench_channel_gpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
SIZES = {
    "64KB": 1 << 16,
    "256KB": 1 << 18,
    "1MB": 1 << 20,
    "4MB": 4 << 20,
    "16MB": 16 << 20,
    "64MB": 64 << 20,
    "256MB": 256 << 20,
    "1GB": 1 << 30,
}


def _consumer(conn) -> None:
    from omni_serve.transport import take

    loop = asyncio.new_event_loop()
    torch.cuda.init()
    while True:
        op, ref = conn.recv()
        if op == "exit":
            return
        if op == "noop":
            torch.cuda.synchronize()
            conn.send(None)
            continue
        got = loop.run_until_complete(take(ref)).to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        conn.send((str(got.device), float(got[-1]) if op == "check" else None))


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 3)


def _rounds(channel, conn, tensor: torch.Tensor, rounds: int) -> tuple[list[float], list[float]]:
    """(payload round times, empty round times), measured in pairs."""
    full, empty = [], []
    for i in range(rounds):
        began = time.perf_counter()
        conn.send(("noop", None))
        conn.recv()
        empty.append(time.perf_counter() - began)
        began = time.perf_counter()
        ref = channel.put(tensor)
        torch.cuda.synchronize()
        conn.send(("check" if i == 0 else "take", ref))
        answer = conn.recv()
        full.append(time.perf_counter() - began)
        if i == 0:
            device, last = answer
            assert device.startswith("cuda") and last == float(tensor[-1]), answer
    return full, empty


def _d2d(tensor: torch.Tensor, rounds: int) -> list[float]:
    out, times = torch.empty_like(tensor), []
    for _ in range(rounds):
        torch.cuda.synchronize()
        began = time.perf_counter()
        out.copy_(tensor)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per size and path")
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_channel_gpu needs a CUDA GPU")
    from omni_serve.transport import DirectChannel, SharedMemoryChannel

    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    consumer = context.Process(target=_consumer, args=(child,), daemon=True)
    consumer.start()
    paths = {"direct": DirectChannel(), "host": SharedMemoryChannel()}
    rows: dict[str, dict[str, float]] = {}
    try:
        for name in args.sizes:
            nbytes = SIZES[name]
            tensor = torch.randn(nbytes // 4, device="cuda")
            rounds = args.rounds if nbytes <= 64 << 20 else max(5, args.rounds // 2)
            _d2d(tensor, 3)
            d2d = _median_ms(_d2d(tensor, rounds))
            row = {"nbytes": nbytes, "d2d_ms": d2d, "d2d_gbps": round(nbytes / d2d / 1e6, 2)}
            for path, channel in paths.items():
                _rounds(channel, conn, tensor, 3)  # warm: registration, landing, segments
                full, empty = _rounds(channel, conn, tensor, rounds)
                added = _median_ms([f - e for f, e in zip(full, empty, strict=True)])
                row[f"{path}_ms"] = added
                row[f"{path}_gbps"] = round(nbytes / added / 1e6, 2) if added > 0 else None
            row["direct_vs_host"] = round(row["host_ms"] / row["direct_ms"], 2)
            row["direct_of_d2d"] = round(row["d2d_ms"] / row["direct_ms"], 3)
            rows[name] = row
            print(name, json.dumps(row), flush=True)
            del tensor
            torch.cuda.empty_cache()
    finally:
        conn.send(("exit", None))
        consumer.join(30)
    summary = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rounds": args.rounds,
        "sizes": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "bench_channel_gpu.json"
    out.write_text(json.dumps(summary, indent=1))
    print(
        f"{'size':>6} {'d2d ms':>8} {'direct ms':>10} {'host ms':>9} {'direct GB/s':>12} "
        f"{'host GB/s':>10} {'direct/host':>12}"
    )
    for name, r in rows.items():
        speedup = f"{r['direct_vs_host']}x"
        print(
            f"{name:>6} {r['d2d_ms']:>8} {r['direct_ms']:>10} {r['host_ms']:>9} "
            f"{r['direct_gbps']:>12} {r['host_gbps']:>10} {speedup:>12}"
        )
    print("wrote", out)


if __name__ == "__main__":
    main()
