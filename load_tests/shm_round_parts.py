"""Where a shared-memory round's time goes beyond its copy: the put timed inside the producer
actor and the take (with the release when its tensor dies) inside the consumer actor, against
the copy round of ``bench_channel.py`` (the producer copies into private memory, an int
travels). Diagnostic, no target: docs/benchmarks.md reads it.

    .venv/bin/python load_tests/shm_round_parts.py     # ~30 s

Writes load_tests/results/shm_round_parts.json (median ms per size, mode and repeat).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
RESULTS = Path(__file__).parent / "results"
SIZES = {"1MB": 1 << 20, "16MB": 16 << 20}
ROUNDS = 60


def main() -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self) -> None:
            from omni_serve.transport import make_channel

            torch.set_num_threads(1)
            self.tensors = {n: torch.ones(n // 4) for n in SIZES.values()}
            self.copies = {n: torch.empty(n // 4) for n in SIZES.values()}
            self.channel = make_channel("shared_memory")
            self.seconds: list[float] = []

        def put(self, nbytes: int, mode: str):
            start = time.perf_counter()
            if mode == "copy":
                self.copies[nbytes].copy_(self.tensors[nbytes])
                out = nbytes
            else:
                out = self.channel.put(self.tensors[nbytes])
            self.seconds.append(time.perf_counter() - start)
            return out

        def median_ms(self) -> float:
            seconds, self.seconds = self.seconds, []
            return statistics.median(seconds) * 1e3

    @ray.remote(num_cpus=0)
    class Consumer:
        def __init__(self) -> None:
            self.seconds: list[float] = []

        async def get(self, ref) -> int:
            from omni_serve.transport import take

            start = time.perf_counter()
            if isinstance(ref, int):
                nbytes = ref
            else:
                tensor = await take(ref)
                nbytes = tensor.numel() * tensor.element_size()
                del tensor  # the release runs here, inside the timing
            self.seconds.append(time.perf_counter() - start)
            return nbytes

        def median_ms(self) -> float:
            seconds, self.seconds = self.seconds, []
            return statistics.median(seconds) * 1e3

    producer, consumer = Producer.remote(), Consumer.remote()

    def round_s(nbytes: int, mode: str) -> float:
        start = time.perf_counter()
        assert ray.get(consumer.get.remote(producer.put.remote(nbytes, mode))) == nbytes
        return time.perf_counter() - start

    for _ in range(100):  # Ray's helper processes settle
        round_s(1 << 20, "copy")
    ray.get([producer.median_ms.remote(), consumer.median_ms.remote()])
    rows = []
    for label, nbytes in SIZES.items():
        for repeat in range(2):
            for mode in ("copy", "shared_memory"):
                rounds = statistics.median(round_s(nbytes, mode) for _ in range(ROUNDS))
                put_ms, take_ms = ray.get(
                    [producer.median_ms.remote(), consumer.median_ms.remote()]
                )
                rows.append(
                    {
                        "size": label,
                        "mode": mode,
                        "repeat": repeat,
                        "round_ms": rounds * 1e3,
                        "put_ms": put_ms,
                        "take_ms": take_ms,
                    }
                )
                print(
                    f"{label:>5} {mode:13s} round {rounds * 1e3:6.3f} ms  put {put_ms:6.3f}  "
                    f"take {take_ms:6.3f}",
                    flush=True,
                )
    ray.shutdown()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shm_round_parts.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
