"""The dependency rule of docs/ARCHITECTURE.md, enforced: no package imports one above it.

Every import in the source (module level or inside a function) is read with `ast` and mapped to
its layer; a layer may import only the layers listed below it. Base utilities (errors, fileio,
config, tensorboard logging, the version) are open to all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"rlflow": "rlflow", "envs": "rlflow.envs", "worldmodel": "rlflow.worldmodel"}
"""Source folder -> the package it installs as (setup.py's package_dir)."""

DIRECT = {
    "graph": set(),
    "cost": {"graph"},
    "rewrite": {"cost"},
    "search": {"rewrite"},
    "nn": {"cost"},
    "zoo": {"graph"},
    "envs": {"nn", "rewrite", "zoo"},
    "agents": {"envs", "search"},
    "worldmodel": {"agents"},
    "advantage": {"worldmodel"},
    "report": {"cost"},
    "runtime": {"cost"},
    "optimize": {"worldmodel", "advantage"},
    "commands": {"optimize", "report"},
    "cli": {"commands"},
}
"""Each layer and the layers directly below it; what those may import, it may too."""
BASE = {"rlflow", "errors", "fileio", "config", "tensorboard"}


def allowed(layer: str) -> set[str]:
    """The layers `layer` may import: the transitive closure of DIRECT."""
    seen: set[str] = set()
    stack = list(DIRECT[layer])
    while stack:
        below = stack.pop()
        if below not in seen:
            seen.add(below)
            stack.extend(DIRECT[below])
    return seen


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    parts[0] = FOLDERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """rlflow.cost.runner -> cost; rlflow.optimize -> optimize; None outside rlflow."""
    parts = module.split(".")
    if parts[0] != "rlflow":
        return None
    return parts[1] if len(parts) > 1 else "rlflow"


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            # `from rlflow import cost` imports a package; `__version__` is only a name
            modules.update(
                f"{node.module}.{alias.name}" for alias in node.names if alias.name[:2] != "__"
            )
    return modules


SOURCES = sorted(path for folder in FOLDERS for path in (REPO / folder).rglob("*.py"))


def test_every_package_has_a_layer():
    layers = {layer_of(module_name(path)) for path in SOURCES}
    assert layers <= set(DIRECT) | BASE, sorted(layers - set(DIRECT) - BASE)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(REPO)))
def test_no_upward_import(path):
    layer = layer_of(module_name(path))
    if layer in BASE:
        permitted: set[str] = set()  # base utilities import only each other
    else:
        permitted = allowed(layer) | {layer}
    wrong = sorted(
        module
        for module in imported_modules(path)
        if (target := layer_of(module)) is not None
        and target not in BASE
        and target not in permitted
    )
    assert not wrong, f"{layer} may not import {wrong}"


def test_the_rule_itself_has_no_cycle():
    for layer in DIRECT:
        assert layer not in allowed(layer), layer
