"""Tests use the product's classes through their public names: a class a module keeps private
(`_Name`) may change shape without notice, and a test that builds one pins that shape."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _private_class_imports(path: Path, root: Path = TESTS) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.split(".")[0] == "vmplacer"):
            continue
        for alias in node.names:
            if not alias.name.startswith("_") or alias.name.startswith("__"):
                continue
            value = getattr(importlib.import_module(node.module), alias.name, None)
            if inspect.isclass(value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}")
    return found


def test_no_test_imports_a_private_class_of_the_product():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100, "the test tree was not found"
    problems = [line for path in files for line in _private_class_imports(path)]
    assert not problems, "tests import private classes:\n" + "\n".join(problems)


def test_the_check_sees_a_private_class_import(tmp_path: Path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("from vmplacer.core.placement.allocate import _Search, allocate\nfrom vmplacer.cli.rebalance import _settings\n")
    # a private class is refused; a public name and a private function are not this rule's
    assert _private_class_imports(sample, tmp_path) == ["test_sample.py:1: vmplacer.core.placement.allocate._Search"]
