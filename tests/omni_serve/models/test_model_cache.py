"""Checkpoints are built offline, deterministically and atomically."""

from __future__ import annotations

import hashlib
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_serve.models.cache import COMPLETE_MARKER, build_atomically, config_hash
from omni_serve.models.registry import ensure_model, presets, resolve_model


def _slow_build(tmp: Path) -> None:
    import time

    (tmp / "weights.bin").write_bytes(b"x" * 1000)
    time.sleep(0.3)


def _build_in_process(root: str) -> str:
    return str(build_atomically("demo", {"a": 1}, _slow_build, root=Path(root)))


def test_concurrent_builders_do_not_clobber_each_other(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        paths = pool.map(_build_in_process, [str(tmp_path)] * 3)
    assert len(set(paths)) == 1
    built = Path(paths[0])
    assert (built / COMPLETE_MARKER).exists() and (built / "weights.bin").stat().st_size == 1000
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temp dirs left


def test_a_failed_build_leaves_nothing(tmp_path):
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_atomically("demo", {"a": 2}, broken, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_config_hash_is_stable_and_sensitive():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def _digest(directory: Path) -> str:
    """Hash of every tensor's name and bytes (the safetensors header order may vary)."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for file in sorted(directory.glob("*.safetensors")):
        tensors = load_file(file)
        for name in sorted(tensors):
            h.update(name.encode())
            h.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_tiny_build_is_deterministic(tmp_path, tiny_omni_path):
    again = ensure_model("tiny-qwen3-omni", root=tmp_path)
    assert again.name == Path(tiny_omni_path).name
    assert _digest(again) == _digest(Path(tiny_omni_path))


def test_cli_prints_the_path():
    out = subprocess.run(
        [sys.executable, "-m", "omni_serve.models", "build", "tiny-qwen3-omni", "--print-path"],
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(out.stdout.strip())
    assert path.is_dir() and (path / "config.json").exists() and (path / "tokenizer.json").exists()


def test_presets_and_resolution(tmp_path):
    assert set(presets()) == {
        "tiny-qwen3-omni",
        "small-qwen3-omni",
        "tiny-qwen2-5-omni",
        "small-qwen2-5-omni",
        "tiny-qwen-image",
        "small-qwen-image",
    }
    assert resolve_model(str(tmp_path)) == tmp_path  # a checkpoint dir is used as is
    with pytest.raises(FileNotFoundError, match="neither a preset"):
        resolve_model("no-such-model")
