"""A command that does not search layouts does not load the solver: ortools (and the pandas it
pulls in) is most of a command's start-up, which `apply`, `plans` and every timer run pay."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("ortools", "pandas")


def _loaded_after(*modules: str) -> set[str]:
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(' '.join(sorted({{n.split('.')[0] for n in sys.modules}})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return set(done.stdout.split())


def test_the_rebalancer_and_the_cli_load_without_the_solver():
    loaded = _loaded_after("vmplacer.cli.main", "vmplacer.cli.rebalance", "vmplacer.bootstrap.rebalance",
                           "vmplacer.bootstrap.container")
    assert "vmplacer" in loaded
    assert not loaded & set(HEAVY), loaded & set(HEAVY)
