"""tests/data/make_sysfs_fixtures.py loaded once as a module (it is a script, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def load():
    name = "make_sysfs_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
