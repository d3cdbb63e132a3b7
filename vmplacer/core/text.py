"""One rule for caller text that ends up in libvirt, the database or a log line.

Control characters end C strings (libvirt's NUL), split log and audit lines,
and cannot appear in XML 1.0; unpaired surrogates cannot be encoded as UTF-8
at all. Labels, names and free-text reasons all use this rule, so every field
refuses the same characters with the same words.
"""

from __future__ import annotations

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
