"""docs/architecture.md's package table is the code's: every package is in it, and the imports
between packages follow its layers (none upward, no cycle)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).parents[1]
ROOTS = ("omni_serve", "deployments", "graphs")
DOC = REPO / "docs" / "architecture.md"


def documented_layers() -> dict[str, int]:
    """``package/`` -> layer, from the doc's "Packages" table."""
    section = DOC.read_text().split("## Packages", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w/]+/)` \| (\d+) \|", section, re.M)
    return {package: int(layer) for package, layer in rows}


def code_packages() -> set[str]:
    return {
        f"{path.parent.relative_to(REPO).as_posix()}/"
        for root in ROOTS
        for path in (REPO / root).rglob("*.py")
    }


def package_of(module: str, packages: set[str]) -> str | None:
    """The deepest package that holds ``module`` (a dotted name, maybe a module's attribute)."""
    path = module.replace(".", "/")
    held = [p for p in packages if f"{path}/".startswith(p) or f"{path}.py".startswith(p)]
    return max(held, key=len, default=None)


def package_imports(packages: set[str]) -> dict[str, set[str]]:
    """package -> the other packages its modules import (at any depth of the module)."""
    imports: dict[str, set[str]] = defaultdict(set)
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            source = f"{path.parent.relative_to(REPO).as_posix()}/"
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    target = package_of(name, packages) if name.startswith(ROOTS) else None
                    if target is not None and target != source:
                        imports[source].add(target)
    return imports


def test_every_package_is_in_the_table():
    missing = code_packages() - documented_layers().keys()
    assert not missing, f"add these to docs/architecture.md's Packages table: {sorted(missing)}"
    gone = documented_layers().keys() - code_packages()
    assert not gone, f"the Packages table names packages that do not exist: {sorted(gone)}"


def test_no_package_imports_a_higher_layer():
    layers = documented_layers()
    upward = [
        f"{source} (layer {layers[source]}) imports {target} (layer {layers[target]})"
        for source, targets in package_imports(set(layers)).items()
        for target in targets
        if source in layers and target in layers and layers[target] > layers[source]
    ]
    assert not upward, upward


def test_the_package_imports_have_no_cycle():
    imports = package_imports(code_packages())
    state: dict[str, str] = {}

    def visit(package: str, trail: list[str]) -> None:
        state[package] = "open"
        for target in sorted(imports.get(package, ())):
            if state.get(target) == "open":
                cycle = trail[trail.index(target) :] if target in trail else trail
                raise AssertionError(f"import cycle: {' -> '.join([*cycle, target])}")
            if target not in state:
                visit(target, [*trail, target])
        state[package] = "done"

    for package in sorted(imports):
        if package not in state:
            visit(package, [package])
