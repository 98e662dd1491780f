import os
import signal

import torch

from omni_serve.transport import copying
from omni_serve.transport.copying import PARALLEL_FROM, PART_ALIGN, copy_bytes, parts


def test_small_copies_stay_on_one_thread() -> None:
    assert parts(PARALLEL_FROM - 1, threads=4) == [(0, PARALLEL_FROM - 1)]
    assert parts(1 << 30, threads=1) == [(0, 1 << 30)]


def test_large_copies_split_into_page_aligned_ranges_that_cover_every_byte() -> None:
    nbytes = 3 * PARALLEL_FROM + 12345  # not a multiple of anything
    ranges = parts(nbytes, threads=4)
    assert len(ranges) == 4
    assert ranges[0][0] == 0 and ranges[-1][1] == nbytes
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(start % PART_ALIGN == 0 for start, _ in ranges)


def test_no_thread_gets_less_than_a_minimum_part() -> None:
    assert len(parts(PARALLEL_FROM, threads=64)) == PARALLEL_FROM // copying.MIN_PART


def test_a_split_copy_copies_every_byte(monkeypatch) -> None:
    monkeypatch.setattr(copying, "PARALLEL_FROM", 1 << 12)
    monkeypatch.setattr(copying, "MIN_PART", 1 << 12)
    src = torch.randint(0, 256, (5 * 4096 + 77,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    assert len(parts(src.numel(), threads=3)) == 3
    copy_bytes(dst, src, threads=3)
    assert torch.equal(dst, src)


def test_a_forked_child_can_split_copies_after_its_parent_did(monkeypatch) -> None:
    monkeypatch.setattr(copying, "PARALLEL_FROM", 1 << 12)
    monkeypatch.setattr(copying, "MIN_PART", 1 << 12)
    src = torch.randint(0, 256, (4 * 4096,), dtype=torch.uint8)
    copy_bytes(torch.empty_like(src), src, threads=2)  # the parent's helpers exist now
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if the split copy finishes and is right
        dst = torch.zeros_like(src)
        signal.alarm(10)
        copy_bytes(dst, src, threads=2)
        os._exit(0 if torch.equal(dst, src) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_where_copies_start_to_split_is_set_by_the_environment() -> None:
    """For machines unlike this one (more memory bandwidth per core): split from 8 MB."""
    import subprocess
    import sys

    code = (
        "from omni_serve.transport.copying import parts; "
        "print(len(parts(8 << 20, threads=4)), len(parts((8 << 20) - 1, threads=4)))"
    )
    env = {**os.environ, "OMNI_CHANNEL_SPLIT_COPY_FROM": str(8 << 20)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["2", "1"], out.stderr[-500:]
