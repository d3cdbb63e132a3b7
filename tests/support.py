"""Helpers shared by tests: the CI rule "missing infrastructure fails, never skips"."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip outside CI when `condition` is false; under CI=true, fail instead."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"required infrastructure missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)
