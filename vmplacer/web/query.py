"""The fleet page's query string: validated field by field (every value is caller input), then
filter, sort and one page of rows. No I/O: rows in, rows out."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PAGE_SIZE = 50
MAX_PAGE = 100_000
STATES = ("ok", "maintenance", "unreadable")
SORT_KEYS = ("name", "state", "guests", "free_cores", "free_memory", "violations")
ORDERS = ("asc", "desc")
FIELDS = ("q", "state", "sort", "order", "page")
NAME_PART = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")


class QueryError(ValueError):
    """A query parameter that breaks its rule; the message names the field and the rule."""

    def __init__(self, field: str, rule: str):
        super().__init__(f"field {field}: {rule}")
        self.field = field
        self.rule = rule


@dataclass(frozen=True)
class FleetQuery:
    q: str = ""
    state: str = ""
    sort: str = "name"
    order: str = "asc"
    page: int = 1

    @classmethod
    def parse(cls, items: Iterable[tuple[str, str]]) -> FleetQuery:
        """From the query string's (name, value) pairs: unknown or repeated fields are refused,
        not ignored (a misspelt filter would otherwise show the whole fleet as if filtered)."""
        given: dict[str, str] = {}
        for name, value in items:
            if name not in FIELDS:
                raise QueryError(name[:40], f"not a parameter of this page (one of {', '.join(FIELDS)})")
            if name in given:
                raise QueryError(name, "given more than once")
            given[name] = value
        q = given.get("q", "")
        if not NAME_PART.match(q):
            raise QueryError("q", "at most 63 characters of A-Z a-z 0-9 _ . -")
        state = given.get("state", "")
        if state not in ("", *STATES):
            raise QueryError("state", f"one of {', '.join(STATES)} (or empty: every state)")
        sort = given.get("sort", "name")
        if sort not in SORT_KEYS:
            raise QueryError("sort", f"one of {', '.join(SORT_KEYS)}")
        order = given.get("order", "asc")
        if order not in ORDERS:
            raise QueryError("order", "asc or desc")
        raw_page = given.get("page", "1")
        if not raw_page.isascii() or not raw_page.isdigit() or len(raw_page) > 6 or not 1 <= int(raw_page) <= MAX_PAGE:
            raise QueryError("page", f"a whole number from 1 to {MAX_PAGE}")
        return cls(q, state, sort, order, int(raw_page))

    def params(self, **changes: Any) -> dict[str, str]:
        """This query with `changes`, as the parameters of a link (defaults left out)."""
        values = {"q": self.q, "state": self.state, "sort": self.sort, "order": self.order,
                  "page": str(self.page), **{k: str(v) for k, v in changes.items()}}
        defaults = {"q": "", "state": "", "sort": "name", "order": "asc", "page": "1"}
        return {k: v for k, v in values.items() if v != defaults[k]}


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    total: int  # rows matching the filter
    fleet: int  # rows before the filter
    page: int
    pages: int


def _sort_key(sort: str) -> Any:
    if sort == "name":
        return lambda row: row["name"]
    return lambda row: (row[sort], row["name"])


def select(rows: Sequence[dict[str, Any]], query: FleetQuery, page_size: int = PAGE_SIZE) -> Page:
    """Filter by name substring (case-insensitive) and state, sort, cut one page; a page past
    the last shows the last. Unknown values (an unreadable host's room, an unchecked host's
    violations) sort last in either order."""
    needle = query.q.lower()
    kept = [r for r in rows if needle in r["name"].lower() and (not query.state or r["state"] == query.state)]
    known = [r for r in kept if query.sort == "name" or r[query.sort] is not None]
    unknown = [r for r in kept if query.sort != "name" and r[query.sort] is None]
    known.sort(key=_sort_key(query.sort), reverse=query.order == "desc")
    kept = known + sorted(unknown, key=lambda r: r["name"])
    pages = max(1, -(-len(kept) // page_size))
    page = min(query.page, pages)
    return Page(kept[(page - 1) * page_size: page * page_size], len(kept), len(rows), page, pages)
