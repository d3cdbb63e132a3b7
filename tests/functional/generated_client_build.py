"""A Python client generated from a live `vmplacer serve`'s OpenAPI document by a third-party
generator (openapi-python-client, pinned in constraints.txt), imported for a test to drive.

The generator's post hooks (formatters) are turned off: what is tested is the document and the
code generated from it, not whether a formatter is installed. A warning from the generator means
a part of the document it could not turn into code, and fails the build.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.support import clean_env, require, run_reporting_hangs

GENERATOR = Path(sys.executable).with_name("openapi-python-client")
GENERATE_TIMEOUT_S = 120.0
CONFIG = "post_hooks: []\n"
REQUEST_TIMEOUT_S = 60.0  # a dry run observes each host for about a second


class GeneratedClient:
    """The generated package `name`: its client classes, models and operation modules."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.package = importlib.import_module(name)
        self.models = importlib.import_module(f"{name}.models")
        self.types = importlib.import_module(f"{name}.types")

    def operation(self, tag: str, operation: str) -> ModuleType:
        """The module of one operation, e.g. ("placements", "create_placement")."""
        return importlib.import_module(f"{self.name}.api.{tag}.{operation}")

    def authenticated(self, base_url: str, token: str) -> Any:
        """A client that raises on any status the document does not declare for the operation."""
        return self.package.AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True,
                                                timeout=httpx.Timeout(REQUEST_TIMEOUT_S))

    def anonymous(self, base_url: str) -> Any:
        return self.package.Client(base_url=base_url, raise_on_unexpected_status=True,
                                   timeout=httpx.Timeout(REQUEST_TIMEOUT_S))


def generate(document: dict[str, Any], directory: Path, name: str) -> None:
    """Run the generator on `document` into `directory/name` (a package, no project around it)."""
    require(GENERATOR.exists(), f"{GENERATOR.name} is not installed (scripts/setup.sh installs the dev extras)")
    spec = directory / "openapi.json"
    spec.write_text(json.dumps(document))
    config = directory / "generator.yaml"
    config.write_text(CONFIG)
    result = run_reporting_hangs(
        [str(GENERATOR), "generate", "--path", str(spec), "--output-path", str(directory / name),
         "--config", str(config), "--meta", "none"],
        timeout=GENERATE_TIMEOUT_S, env=clean_env(), cwd=directory)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"the generator refused the document (exit {result.returncode}):\n{output[-6000:]}", pytrace=False)
    assert "warning" not in output.lower(), f"the generator could not use part of the document:\n{output[-6000:]}"


@contextmanager
def generated_client(document: dict[str, Any], directory: Path, name: str) -> Iterator[GeneratedClient]:
    """The client generated from `document`, importable as `name` while the block runs."""
    generate(document, directory, name)
    sys.path.insert(0, str(directory))
    try:
        yield GeneratedClient(name)
    finally:
        sys.path.remove(str(directory))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
