"""Finding guests by name across the fleet: the query is checked against an explicit rule
(every value is caller input), then matched as a plain, case-insensitive substring of the
names already read — never a pattern, so no character of it means anything. No I/O: names
in, matches out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_QUERY = 128  # characters; no guest is searched for by more
SHOWN = 50  # matches listed; the page says how many more there are


@dataclass(frozen=True)
class Found:
    """One page of matches: those shown (guest, host) and how many matched in all."""

    matches: list[tuple[str, str]]
    total: int

    @property
    def more(self) -> int:
        return self.total - len(self.matches)


def query_problem(values: list[str]) -> str:
    """Why the `q` parameters cannot be searched for ("" when they can): exactly one, 1 to
    MAX_QUERY characters once surrounding blanks are dropped, no control characters."""
    if len(values) > 1:
        return "field q: given more than once"
    text = values[0].strip() if values else ""
    if not text:
        return "field q: type part of a guest's name (1 to 128 characters)"
    if len(text) > MAX_QUERY:
        return f"field q: at most {MAX_QUERY} characters (this one has {len(text)})"
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in text):
        return "field q: no control characters"
    return ""


def find(placed: Iterable[tuple[str, str]], query: str, shown: int = SHOWN) -> Found:
    """The (guest, host) pairs whose guest name holds `query`, ignoring case, ordered by guest
    then host; the first `shown` of them, and how many there are."""
    needle = query.strip().casefold()
    matched = sorted((guest, host) for guest, host in placed if needle in guest.casefold())
    return Found(matched[:shown], len(matched))
