"""Tests use the product through its public names: a class or function a module keeps private
(`_name`) may change shape without notice, and a test that imports one pins that shape."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _private_imports(path: Path, root: Path = TESTS) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.split(".")[0] == "vmplacer"):
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}")
    return found


def test_no_test_imports_a_private_name_of_the_product():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100, "the test tree was not found"
    problems = [line for path in files for line in _private_imports(path)]
    assert not problems, "tests import private names:\n" + "\n".join(problems)


def test_the_check_sees_private_classes_and_functions(tmp_path: Path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("from vmplacer.core.placement.allocate import _Search, allocate\n"
                      "from vmplacer.cli.rebalance import _settings\n"
                      "from vmplacer import __version__\n")
    # a public name and a dunder are fine; a private class or function is not
    assert _private_imports(sample, tmp_path) == ["test_sample.py:1: vmplacer.core.placement.allocate._Search",
                                                  "test_sample.py:2: vmplacer.cli.rebalance._settings"]
