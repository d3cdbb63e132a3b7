"""Durations written by operators ('10ms', '2.5s', '30d') as seconds.

Pure text → number, shared by the config reader and the command line, so the
lowest layer (config) needs nothing from a front end to read its own file.
"""

from __future__ import annotations

import math
import re

from vmplacer.core.text import excerpt

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_UNIT_NAMES = ("us", "µs", "ms", "s", "m", "min", "h", "d")
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*({'|'.join(_UNIT_NAMES)})?\s*$")
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}


def duration_seconds(text: str, default_unit: str | None, *, days: bool = False) -> float | None:
    """Seconds from a duration, or None when `text` is not one. Days ('30d') only when
    `days` is set: retention ages are counted in days, a freeze or a grace never is. A bare
    number is in `default_unit`; with None it is not a duration (where a unit must be written)."""
    match = _DURATION.match(str(text))
    if not match or (match.group(2) == "d" and not days):
        return None
    unit = match.group(2) or default_unit
    return None if unit is None else float(match.group(1)) * _UNITS[unit]


def duration_pattern(*, days: bool = False, unit_required: bool = False) -> str:
    """The regular expression of the text `duration_seconds` reads (days only with `days`; the
    unit optional unless `unit_required`), for the config file's JSON Schema: the schema and the
    reader spell durations alike."""
    units = [unit for unit in _UNIT_NAMES if days or unit != "d"]
    return rf"^\s*{_NUMBER}\s*({'|'.join(units)}){'' if unit_required else '?'}\s*$"


# The config file's one convention: every duration key takes s, m, h and d (and ms, us); a bare
# number is seconds only where the key's name says so (`interval_s: 2`), because `retention: 30`
# read as 30 seconds would keep almost nothing; elsewhere it is refused, asking for a unit.
CONFIG_UNITS = "s, m, h, d"


def bare_number_is_seconds(key: str) -> bool:
    """Whether the config key `key` (dotted path) takes a bare number of seconds: its name ends
    in `_s`, or is `seconds`, the unit it is counted in (`rebalance.probes.seconds: 5`)."""
    name = key.rsplit(".", 1)[-1]
    return name.endswith("_s") or name == "seconds"


def config_duration(value: object, key: str) -> float | str:
    """Seconds from a config file value of the duration key `key`, or the rule it breaks (for the
    message naming the key): a number and its unit, or a bare number on a `*_s` key."""
    named = bare_number_is_seconds(key)
    wanted = (f"must be a number of seconds or a duration with a unit ({CONFIG_UNITS}; e.g. 30s, 10m, 1h)" if named
              else f"must be a duration with a unit ({CONFIG_UNITS}; e.g. 30s, 10m, 12h, 30d)")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, str) and not is_bare_number(value):
        seconds = duration_seconds(value, None, days=True)
        return f"{wanted}, got {_shown(value)}" if seconds is None else seconds
    if not number and not isinstance(value, str):
        return f"{wanted}, got {_shown(value)}"
    if not named:
        return f"a duration needs a unit ({CONFIG_UNITS}), got {_shown(value)}"
    seconds = float(str(value))  # an int, a float or the text of one
    if not math.isfinite(seconds):
        return f"must be a finite number of seconds, got {_shown(value)}"
    return seconds


def _shown(value: object) -> str:
    """A value for a message: a number as written, text quoted and bounded (caller input never
    floods an error line)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return excerpt(value)


def is_bare_number(text: str) -> bool:
    """Whether `text` is a number without a unit ('10', '2.5'): read as a duration only where
    a default unit is agreed."""
    match = _DURATION.match(str(text))
    return match is not None and match.group(2) is None


def format_seconds(seconds: float) -> str:
    """A duration in its largest whole-ish unit ('200 ms', '1 h', '1.5 s'), for messages."""
    if seconds == 0:
        return "0 s"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds / 1e-6:g} us"
