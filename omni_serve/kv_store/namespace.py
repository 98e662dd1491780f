"""The store's namespace: what a kept prefix is valid for. KV is only right for the model that
computed it, read with the tokenizer that made its ids; a page of any other namespace is
refused. A fingerprint of the files, not a digest of every weight: a 30B checkpoint would take
minutes to hash, and its files' sizes and ends differ between any two trainings."""

from __future__ import annotations

from pathlib import Path

import blake3

_EDGE_BYTES = 1 << 20
_WHOLE = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def model_namespace(model_path: Path | str, salt: str = "") -> str:
    """A digest of the checkpoint's config and tokenizer files, and of each weights file's
    size, head and tail; ``salt`` for whatever else the KV depends on (the engine's dtype)."""
    root = Path(model_path)
    hasher = blake3.blake3(salt.encode())
    for name in _WHOLE:
        path = root / name
        if path.is_file():
            hasher.update(f"{name}:".encode())
            hasher.update(path.read_bytes())
    for path in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        size = path.stat().st_size
        hasher.update(f"{path.name}:{size}:".encode())
        with path.open("rb") as f:
            hasher.update(f.read(_EDGE_BYTES))
            f.seek(max(size - _EDGE_BYTES, 0))
            hasher.update(f.read(_EDGE_BYTES))
    return hasher.hexdigest()
