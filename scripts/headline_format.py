"""How the headline tables write a figure, where it was measured, and a target's verdict."""

from __future__ import annotations


def cell(figure: dict | None, digits: int = 2) -> str:
    """A median with its range over the repeats."""
    if not figure:
        return "-"
    median, low, high = (f"{figure[k]:.{digits}f}" for k in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def provenance(summary: dict) -> str:
    machine = summary["machine"]
    where = f"{machine['cores']} cores ({machine['cpu']})"
    if machine.get("gpu"):
        where += f", {machine['gpu']}"
    runs = summary["repeats"]
    spread = f"median of {runs} runs (range in brackets)" if runs > 1 else "one run"
    return f"`{summary['command']}` at `{summary['commit']}` on {where}; {spread}."


def verdict(value: float, bar: float, below: bool) -> str:
    met = value <= bar if below else value >= bar
    return f"{'met' if met else '**not met**'} ({'<=' if below else '>='} {bar:g})"
