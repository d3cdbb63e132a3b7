"""The linter and the type checker, as CI runs them: `ruff check` and `mypy` with the settings
of pyproject.toml, at the versions constraints.txt pins. A finding fails the test with the
tool's own report, so a broken name, an unused import or a type that does not fit is caught
before any test that would only trip over it by chance."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.support import require, run_reporting_hangs

ROOT = Path(__file__).resolve().parents[2]

# Own CPU time a run may take before it counts as hung (mypy over the package without a cache
# needs about 25 s of it, ruff well under one).
HANG_S = 300.0


def _pinned(package: str) -> str:
    """The version constraints.txt pins `package` to."""
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, pinned = line.partition("==")
        if name.strip().lower() == package:
            return pinned.strip()
    raise AssertionError(f"constraints.txt pins no version of {package}")


def _require_tool(package: str) -> None:
    """The tool is installed beside the tests' interpreter, at its pinned version."""
    require(importlib.util.find_spec(package) is not None,
            f"{package} is not installed in {sys.prefix} (scripts/setup.sh installs the dev extras)")
    assert version(package) == _pinned(package), (
        f"{package} {version(package)} is installed, constraints.txt pins {_pinned(package)}")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_reporting_hangs([sys.executable, "-m", *args], timeout=HANG_S, cwd=ROOT)


def test_ruff_finds_nothing():
    _require_tool("ruff")
    checked = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert checked.returncode == 0, f"ruff check found problems:\n{checked.stdout}{checked.stderr}"
    # what it read: the package, the tests, the benchmarks (none silently left out)
    listed = _run("ruff", "check", "--no-cache", "--show-files", ".")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    tops = {Path(line.strip()).resolve().relative_to(ROOT).parts[0] for line in listed.stdout.splitlines()
            if line.strip().endswith(".py")}
    assert {"vmplacer", "tests", "benchmarks"} <= tops, f"ruff checked only {sorted(tops)}"


def test_mypy_finds_nothing(tmp_path):
    _require_tool("mypy")
    # a fresh cache outside the checkout: a full run, as on a clean clone, writing nothing here
    result = _run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"))
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy found problems:\n{report}"
    checked = re.search(r"no issues found in (\d+) source files", report)
    assert checked, report
    modules = sum(1 for _ in (ROOT / "vmplacer").rglob("*.py"))
    assert int(checked.group(1)) == modules, f"mypy checked {checked.group(1)} of the package's {modules} modules"
