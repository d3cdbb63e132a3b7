"""Fixtures shared by the unit tests of the topology readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit import sysfs_fixtures


@pytest.fixture(scope="session")
def sysfs_roots(tmp_path_factory) -> dict[str, Path]:
    """Every machine of make_sysfs_fixtures.py as a sysfs tree, written once per session (read only)."""
    return sysfs_fixtures.load().build_all(tmp_path_factory.mktemp("sysfs"))
