"""One rule for caller text that ends up in libvirt, the database or a log line.

Control characters end C strings (libvirt's NUL), split log and audit lines,
and cannot appear in XML 1.0; unpaired surrogates cannot be encoded as UTF-8
at all. Labels, names and free-text reasons all use this rule, so every field
refuses the same characters with the same words.
"""

from __future__ import annotations

from datetime import datetime, timezone

CONTROL_RULE = ("no control characters (U+0000-U+001F, U+007F-U+009F), unpaired surrogates "
                "(U+D800-U+DFFF) or U+FFFE/U+FFFF")


def _forbidden(code: int) -> bool:
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF or code in (0xFFFE, 0xFFFF)


def first_forbidden(text: str) -> tuple[int, str] | None:
    """(position, character) of the first character CONTROL_RULE refuses, or None."""
    for position, char in enumerate(text):
        if _forbidden(ord(char)):
            return position, char
    return None


def control_problem(text: str) -> str | None:
    """Why `text` breaks CONTROL_RULE (naming the character and where), or None."""
    found = first_forbidden(text)
    if found is None:
        return None
    position, char = found
    return f"U+{ord(char):04X} at position {position} is not allowed: {CONTROL_RULE}"


def excerpt(text: object, limit: int = 80) -> str:
    """`text` quoted for a message: repr escapes control characters and quotes, and anything
    past `limit` characters is cut, so caller input never floods or splits an error line."""
    shown = str(text)
    if len(shown) > limit:
        return repr(shown[:limit]) + f"… ({len(shown)} characters)"
    return repr(shown)


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """'1 guest', '2 guests', '0 guests': a count with its noun, never 'guest(s)'."""
    noun = singular if count == 1 else (plural_form or singular + "s")
    return f"{count} {noun}"


def iso_utc(moment: datetime | float | int) -> str:
    """A moment (aware or naive-as-UTC datetime, or epoch seconds) as ISO 8601 UTC to the
    second, `2026-11-27T23:54:29Z`: one spelling for every timestamp an operator or a script reads."""
    if isinstance(moment, datetime):
        aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    else:
        aware = datetime.fromtimestamp(float(moment), tz=timezone.utc)
    return aware.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
