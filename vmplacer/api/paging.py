"""Cursor paging of every list: an opaque `cursor`, a `next` link, one stable order.

A cursor carries the key of the last row a page showed, the list it belongs to and a digest
of the filters it was made under, sealed by a checksum. A cursor that was altered, belongs
to another list or is replayed under other filters is refused (422 naming `query.cursor`):
a page never silently comes from another question. The cursor holds only what the caller's
own answer already showed, so it needs no secret; the page size may change between pages.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import Query, Request, Response

from vmplacer.api.errors import ApiError

T = TypeVar("T")
VERSION = 1
SEAL_BYTES = 8
MAX_CURSOR = 512
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,512}$"

CursorQuery = Query(default=None, min_length=1, max_length=MAX_CURSOR, pattern=CURSOR_PATTERN,
                    description="where the page starts: the `next_cursor` of the previous page (opaque; only valid "
                                "with the same filters)")


def _seal(payload: bytes) -> bytes:
    return hashlib.sha256(b"vmplacer-cursor\x00" + payload).digest()[:SEAL_BYTES]


def _digest(filters: Mapping[str, Any]) -> str:
    canonical = json.dumps({k: sorted(v) if isinstance(v, (list, tuple, set)) else v
                            for k, v in filters.items() if v is not None and v != [] and v != {}},
                           sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def encode(listing: str, filters: Mapping[str, Any], key: Sequence[Any]) -> str:
    payload = json.dumps({"v": VERSION, "l": listing, "f": _digest(filters), "k": list(key)},
                         separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(payload + _seal(payload)).decode().rstrip("=")


def refused(reason: str, rule: str = "cursor_invalid") -> ApiError:
    return ApiError(422, "validation", f"field query.cursor: {reason}",
                    [{"field": "query.cursor", "rule": rule, "reason": reason}])


def decode(token: str | None, listing: str, filters: Mapping[str, Any],
           key: Callable[[list[Any]], T]) -> T | None:
    """The key a cursor carries, checked by `key` (which raises ValueError for a malformed one);
    None without a cursor."""
    if token is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise refused("not a cursor this server made (not base64url)") from None
    payload, seal = raw[:-SEAL_BYTES], raw[-SEAL_BYTES:]
    if len(raw) <= SEAL_BYTES or _seal(payload) != seal:
        raise refused("not a cursor this server made, or altered (its checksum does not match)")
    try:
        data = json.loads(payload)
    except ValueError:
        raise refused("not a cursor this server made (unreadable)") from None
    if not isinstance(data, dict) or data.get("v") != VERSION or not isinstance(data.get("k"), list):
        raise refused("not a cursor this server made (unknown version)")
    if data.get("l") != listing:
        raise refused(f"a cursor of another list ({data.get('l')!r}), not of {listing}", "cursor_mismatch")
    if data.get("f") != _digest(filters):
        raise refused("made under other filters: page with the filters of the first page", "cursor_mismatch")
    try:
        return key(data["k"])
    except (ValueError, TypeError, IndexError):
        raise refused("not a cursor this server made (malformed key)") from None


def int_key(values: list[Any]) -> int:
    (value,) = values
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**63:
        raise ValueError(f"bad id {value!r}")
    return value


def paged(request: Request, response: Response, listing: str, filters: Mapping[str, Any],
          last_key: Sequence[Any] | None) -> dict[str, str | None]:
    """`next_cursor` and `next` (this request's URL with the cursor moved on) for the body, and
    the same link as `Link: <...>; rel="next"`; both null on the last page."""
    if last_key is None:
        return {"next_cursor": None, "next": None}
    cursor = encode(listing, filters, last_key)
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"] + [("cursor", cursor)]
    link = f"{request.url.path}?{urlencode(query)}"
    response.headers["Link"] = f'<{link}>; rel="next"'
    return {"next_cursor": cursor, "next": link}
