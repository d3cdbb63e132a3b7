"""Timestamps as the API shows them: ISO 8601 UTC strings, as the CLI and the audit log
spell them, never epoch floats (a script reading two outputs should not convert one)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from vmplacer.core.text import iso_utc

ISO_HELP = "ISO 8601 UTC, e.g. 2026-11-28T03:59:12Z"


def api_time(moment: datetime | float | int | str | None) -> str | None:
    """None stays None; a string is taken as already spelled."""
    if moment is None or isinstance(moment, str):
        return moment
    return iso_utc(moment)


def with_api_times(data: Mapping[str, Any], *fields: str) -> dict[str, Any]:
    """A copy of `data` with the named timestamp fields spelled for the API."""
    result = dict(data)
    for name in fields:
        if name in result:
            result[name] = api_time(result[name])
    return result
