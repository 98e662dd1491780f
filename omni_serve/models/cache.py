"""Where built checkpoints live, and building one atomically.

A checkpoint is built in a temporary sibling directory and renamed into place, so a reader never
sees a half-written checkpoint and two processes building the same preset at once cannot
clobber each other: the loser of the rename race throws its copy away and uses the winner's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_ENV = "OMNI_SERVE_MODEL_CACHE"
COMPLETE_MARKER = ".omni_serve_complete"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "omni_serve" / "models"
    return Path(os.environ.get(CACHE_ENV, default)).expanduser()


def config_hash(spec: dict[str, Any]) -> str:
    """Short stable hash of everything that determines a checkpoint's bytes."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_atomically(
    name: str, spec: dict[str, Any], build: Callable[[Path], None], root: Path | None = None
) -> Path:
    """Return ``<root>/<name>-<hash>``, building it with ``build(tmp_dir)`` if it is missing."""
    root = root or cache_root()
    target = root / f"{name}-{config_hash(spec)}"
    if (target / COMPLETE_MARKER).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        build(tmp)
        (tmp / "omni_serve_spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True))
        (tmp / COMPLETE_MARKER).write_text("")
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process renamed its copy first (the target is a non-empty dir now).
            if not (target / COMPLETE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
