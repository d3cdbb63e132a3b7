"""List cursors: opaque, sealed, bound to their list and filters; every refusal names `query.cursor`."""

from __future__ import annotations

import base64
import json
import re

import pytest

from vmplacer.api.errors import ApiError
from vmplacer.api.paging import CURSOR_PATTERN, MAX_CURSOR, decode, encode, int_key


def _problem(exc: pytest.ExceptionInfo[ApiError]) -> dict:
    assert exc.value.status == 422 and exc.value.code == "validation"
    (problem,) = exc.value.details
    assert problem["field"] == "query.cursor"
    return problem


def test_a_cursor_round_trips_under_its_list_and_filters_in_any_order():
    filters = {"state": ["running", "planned"], "host": "h1", "label": None}
    cursor = encode("placements", filters, [41])
    assert re.match(CURSOR_PATTERN, cursor) and len(cursor) <= MAX_CURSOR
    same = {"host": "h1", "state": ["planned", "running"]}  # order of a repeated filter, absent filters: same
    assert decode(cursor, "placements", same, int_key) == 41
    assert decode(None, "placements", same, int_key) is None


@pytest.mark.parametrize("listing, filters, rule", [
    ("plans", {"state": ["running", "planned"], "host": "h1"}, "cursor_mismatch"),
    ("placements", {"state": ["running"], "host": "h1"}, "cursor_mismatch"),
    ("placements", {"state": ["running", "planned"], "host": "h2"}, "cursor_mismatch"),
])
def test_a_cursor_of_another_list_or_other_filters_is_refused(listing, filters, rule):
    cursor = encode("placements", {"state": ["running", "planned"], "host": "h1"}, [41])
    with pytest.raises(ApiError) as exc:
        decode(cursor, listing, filters, int_key)
    assert _problem(exc)["rule"] == rule


def test_every_altered_byte_and_every_forged_key_is_refused():
    cursor = encode("jobs", {}, [7])
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    for position in range(len(raw)):
        altered = bytearray(raw)
        altered[position] ^= 0x20
        token = base64.urlsafe_b64encode(bytes(altered)).decode().rstrip("=")
        with pytest.raises(ApiError) as exc:
            decode(token, "jobs", {}, int_key)
        assert _problem(exc)["rule"] == "cursor_invalid", position
    for junk in ("", "A", "AAAA", "%%%", cursor[:-1]):
        with pytest.raises(ApiError) as exc:
            decode(junk, "jobs", {}, int_key)
        assert _problem(exc)["rule"] == "cursor_invalid", junk
    for key in ([0], [-1], ["7"], [True], [7, 8], [], [2**64]):  # sealed by the server, but not a key of its
        forged = encode("jobs", {}, key)
        with pytest.raises(ApiError) as exc:
            decode(forged, "jobs", {}, int_key)
        assert _problem(exc)["rule"] == "cursor_invalid", key


def test_a_cursor_says_nothing_the_page_did_not():
    cursor = encode("audit", {"host": "h1"}, [9119])
    payload = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))[:-8]
    assert json.loads(payload)["k"] == [9119] and b"h1" not in payload  # the filters only as a digest
