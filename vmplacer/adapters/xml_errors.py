"""lxml's syntax errors as an operator reads them: the line and column in the file the caller
names, without lxml's `(<string>, line 1)` (the name of text parsed from memory)."""

from __future__ import annotations

import re
from typing import Any

_LIMIT = 200  # longest parser message quoted: lxml echoes element names from the document

_LXML_POSITION = re.compile(r",? line \d+, column \d+$")


def xml_problem(exc: Any) -> str:
    """'not well-formed XML at line 2, column 16: Opening and ending tag mismatch: name line 2 and
    nam' from an lxml XMLSyntaxError, without lxml's '(<string>, line 2)'."""
    message = _LXML_POSITION.sub("", str(getattr(exc, "msg", "") or exc).strip())
    position = getattr(exc, "position", None)
    where = f" at line {position[0]}, column {position[1]}" if position and position[0] else ""
    return f"not well-formed XML{where}: {_bounded(message)}"


def _bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _LIMIT else text[:_LIMIT] + "…"
