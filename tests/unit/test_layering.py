"""The pure core stays pure: a build-breaking check of ARCHITECTURE.md's rule."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "vmplacer" / "core"
ALLOWED_THIRD_PARTY = {"numpy"}
FORBIDDEN_PROJECT = ("vmplacer.adapters", "vmplacer.app", "vmplacer.api", "vmplacer.cli",
                     "vmplacer.bootstrap", "vmplacer.config", "vmplacer.ports", "vmplacer.testbed")
# Standard-library modules that would smuggle I/O or a clock into the core.
FORBIDDEN_STDLIB = {"os", "subprocess", "socket", "time", "sqlite3", "threading", "shutil", "pathlib"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_imports_only_stdlib_numpy_and_core():
    import sys

    stdlib = set(sys.stdlib_module_names)
    problems = []
    files = sorted(CORE.rglob("*.py"))
    assert files, "vmplacer/core has no modules"
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith(FORBIDDEN_PROJECT) or top in FORBIDDEN_STDLIB:
                problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
            elif top == "vmplacer":
                if not name.startswith("vmplacer.core"):
                    problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
            elif top not in stdlib and top not in ALLOWED_THIRD_PARTY and top != "__future__":
                problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
    assert not problems, "vmplacer/core must stay pure:\n" + "\n".join(problems)
