"""Layers point down: runtime/ imports none of the packages above it, and check/ and
calibration/ do not import each other (STYLE.md habit 12)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "graphfix"


def _imports(package: str) -> dict[str, set[str]]:
    """module file -> the graphfix packages it imports (at any depth, lazy ones too)."""
    found: dict[str, set[str]] = {}
    for path in (SRC / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        found[str(path.relative_to(SRC))] = {
            n.split(".")[1] for n in names if n.startswith("graphfix.") and n.count(".") >= 1
        }
    return found


@pytest.mark.parametrize("package, forbidden", [
    ("runtime", {"check", "calibration", "passes", "cli", "api", "doctor", "nms", "plugins"}),
    ("check", {"calibration", "cli", "api"}),
    ("calibration", {"check", "cli"}),
    ("htmlreport", {"cli", "api", "passes"}),
    ("passes", {"check", "calibration", "cli"}),
])
def test_layers_point_down(package, forbidden):
    wrong = {f: sorted(p & forbidden) for f, p in _imports(package).items() if p & forbidden}
    assert wrong == {}
