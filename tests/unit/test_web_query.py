"""The fleet page's query string: each field's rule, and filtering, sorting, paging."""

from __future__ import annotations

import pytest

from vmplacer.web.query import FleetQuery, QueryError, select


def rows(n: int) -> list[dict]:
    return [{"name": f"h{i:04d}", "state": ("ok", "maintenance", "unreadable")[i % 3],
             "guests": None if i % 3 == 2 else i % 7, "violations": None if i % 5 == 0 else i % 2} for i in range(n)]


def test_defaults_and_round_trip_of_link_parameters():
    query = FleetQuery.parse([])
    assert query == FleetQuery() and query.params() == {}
    query = FleetQuery.parse([("q", "h00"), ("sort", "guests"), ("order", "desc"), ("page", "2")])
    assert FleetQuery.parse(query.params(page=3).items()) == FleetQuery("h00", "", "guests", "desc", 3)


@pytest.mark.parametrize("items, field", [
    ([("page", "0")], "page"), ([("page", "-1")], "page"), ([("page", "١")], "page"), ([("sort", "x")], "sort"),
    ([("q", "a b")], "q"), ([("state", "OK")], "state"), ([("order", "")], "order"), ([("x", "1")], "x"),
    ([("q", "a"), ("q", "b")], "q"),
])
def test_each_bad_field_is_named(items, field):
    with pytest.raises(QueryError) as caught:
        FleetQuery.parse(items)
    assert caught.value.field == field and str(caught.value).startswith(f"field {field}: ")


def test_filter_sort_and_pages_cover_the_fleet_once():
    fleet = rows(1000)
    seen = []
    for page in range(1, 21):
        result = select(fleet, FleetQuery(sort="guests", order="desc", page=page))
        seen += result.rows
    assert len(seen) == 1000 and len({r["name"] for r in seen}) == 1000 and result.pages == 20
    first = select(fleet, FleetQuery(sort="guests", order="desc")).rows
    assert [r["guests"] for r in first] == sorted((r["guests"] for r in first), reverse=True)
    last = select(fleet, FleetQuery(sort="guests", order="desc", page=20))
    assert all(r["guests"] is None for r in last.rows)  # unknown values sort last in either order
    assert select(fleet, FleetQuery(page=999)).page == 20  # past the end: the last page
    only = select(fleet, FleetQuery(q="H000", state="ok"))
    assert [r["name"] for r in only.rows] == ["h0000", "h0003", "h0006", "h0009"] and only.fleet == 1000
