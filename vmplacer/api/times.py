"""Timestamps as the API shows them: ISO 8601 UTC strings, as the CLI and the audit log
spell them, never epoch floats (a script reading two outputs should not convert one).

Response models declare them as `ApiTime`: a string with `format: date-time` (RFC 3339),
so a generated client reads a datetime, not a number or free text.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field

from vmplacer.core.text import iso_utc

ISO_HELP = "ISO 8601 UTC, e.g. 2026-11-28T03:59:12Z"

ApiTime = Annotated[str, Field(description=ISO_HELP, json_schema_extra={"format": "date-time"})]


def api_time(moment: datetime | float | int | str | None) -> str | None:
    """None stays None; a string is taken as already spelled."""
    if moment is None or isinstance(moment, str):
        return moment
    return iso_utc(moment)


def api_timestamp(moment: datetime | float | int | str | None) -> str | None:
    """Like `api_time`, but an ISO 8601 string (a store's `isoformat()`, naive meaning UTC)
    is spelled again the one way; a string that is no date-time is kept as it is."""
    if isinstance(moment, str):
        try:
            return iso_utc(datetime.fromisoformat(moment.replace("Z", "+00:00")))
        except ValueError:
            return moment
    return api_time(moment)


def with_api_times(data: Mapping[str, Any], *fields: str) -> dict[str, Any]:
    """A copy of `data` with the named timestamp fields spelled for the API."""
    result = dict(data)
    for name in fields:
        if name in result:
            result[name] = api_timestamp(result[name])
    return result
