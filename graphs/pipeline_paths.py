"""What every graph builder does the same way: find its pipeline config."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).parents[1]


def pipeline_path(value: str | Path) -> Path:
    """Relative paths resolve against the working directory, else the repo root, so the same
    Serve YAML works for ``serve run`` and ``serve deploy``."""
    path = Path(value)
    if not path.is_absolute() and not path.exists() and (REPO / path).exists():
        return REPO / path
    return path
