"""Durations written by operators ('10ms', '2.5s', '30d') as seconds.

Pure text → number, shared by the config reader and the command line, so the
lowest layer (config) needs nothing from a front end to read its own file.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m|min|h|d)?\s*$")
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}


def duration_seconds(text: str, default_unit: str, *, days: bool = False) -> float | None:
    """Seconds from a duration, or None when `text` is not one. Days ('30d') only when
    `days` is set: retention ages are counted in days, a freeze or a grace never is."""
    match = _DURATION.match(str(text))
    if not match or (match.group(2) == "d" and not days):
        return None
    return float(match.group(1)) * _UNITS[match.group(2) or default_unit]
