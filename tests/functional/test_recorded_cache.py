"""The placements recorded for a host, as placing reads them (cached between reads), always
match the database: rows another instance inserts, updates, re-states or deletes are seen by
the next read (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from vmplacer.adapters.db.engine import make_engine, make_session_factory
from vmplacer.adapters.db.placements import SqlPlacementStore, placements_on_host
from vmplacer.adapters.db.plans import SqlPlacementUpdates
from vmplacer.core.placement.guest_placement import Placement


def _pinned(guest: str, cpus: set[int], host: str = "h1") -> Placement:
    return Placement(guest=guest, host=host, vcpupin={0: frozenset(cpus)}, memory_kib=65536)


@pytest.fixture
def two_instances(migrated_url):
    """Two stores on two engines: what one writes, the other did not see being written."""
    engines = [make_engine(migrated_url), make_engine(migrated_url)]
    sessions = [make_session_factory(e) for e in engines]
    yield SqlPlacementStore(sessions[0]), SqlPlacementStore(sessions[1]), sessions
    for engine in engines:
        engine.dispose()


def _seen(store: SqlPlacementStore, sessions, host: str = "h1") -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    cached = store.occupied(host)
    with sessions() as session:
        direct = placements_on_host(session, host)
    assert cached == direct  # same placements, same order as a full read
    return [(p.guest, {v: sorted(c) for v, c in p.vcpupin.items()}) for p in cached]


def test_writes_of_another_instance_are_seen_by_the_next_read(two_instances):
    reader, writer, sessions = two_instances
    assert _seen(reader, sessions[0]) == []
    writer.record("h1", "test:///h1", _pinned("a", {0, 1}), {})
    writer.record("h1", "test:///h1", _pinned("b", {2}), {})
    writer.record("h2", "test:///h2", _pinned("z", {0}, "h2"), {})  # another host's rows change nothing here
    assert _seen(reader, sessions[0]) == [("a", {0: [0, 1]}), ("b", {0: [2]})]
    assert _seen(reader, sessions[0]) == [("a", {0: [0, 1]}), ("b", {0: [2]})]  # unchanged: served again

    SqlPlacementUpdates(sessions[1], {"h1": "test:///h1"}).apply([_pinned("a", {3})])  # repinned elsewhere
    assert _seen(reader, sessions[0]) == [("a", {0: [3]}), ("b", {0: [2]})]

    writer.set_state("b", "removed")  # no longer holds resources
    assert _seen(reader, sessions[0]) == [("a", {0: [3]})]
    writer.set_state("b", "defined")
    assert _seen(reader, sessions[0]) == [("a", {0: [3]}), ("b", {0: [2]})]

    writer.forget("a")  # deleted: the count no longer adds up, everything is read again
    assert _seen(reader, sessions[0]) == [("b", {0: [2]})]
    writer.forget("b")
    writer.record("h1", "test:///h1", _pinned("c", {5}), {})  # a delete and an insert between two reads
    assert _seen(reader, sessions[0]) == [("c", {0: [5]})]


def test_a_row_changed_without_a_newer_timestamp_is_seen_within_the_full_read_interval(two_instances,
                                                                                       monkeypatch):
    """A writer whose clock runs behind leaves the newest updated_at as it was: the periodic
    full read catches its change."""
    from vmplacer.adapters.db import placements as module

    reader, writer, sessions = two_instances
    writer.record("h1", "test:///h1", _pinned("a", {0}), {})
    writer.record("h1", "test:///h1", _pinned("b", {1}), {})
    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    assert [p.guest for p in reader.occupied("h1")] == ["a", "b"]
    with sessions[1]() as session:  # b's placement changes, its updated_at goes back in time
        moved = _pinned("b", {7}).to_dict()
        session.execute(text("UPDATE placements SET placement = :p, updated_at = :t WHERE guest = 'b'"),
                        {"p": json.dumps(moved), "t": "2000-01-01 00:00:00"})
        session.commit()
    now[0] += module.RECORDED_MAX_AGE_S + 0.1
    assert _seen(reader, sessions[0]) == [("a", {0: [0]}), ("b", {0: [7]})]


def test_the_recorded_guests_anti_affinity_follows_their_rows(two_instances):
    reader, writer, _ = two_instances
    writer.record("h1", "test:///h1", _pinned("a", {0}), {"anti_affinity": ["b", "c"]})
    writer.record("h1", "test:///h1", _pinned("b", {1}), {"anti_affinity": []})
    writer.record("h1", "test:///h1", _pinned("n", {2}), {})  # a spec of another era: no such key
    writer.record("h2", "test:///h2", _pinned("z", {0}, "h2"), {"anti_affinity": ["a"]})
    assert reader.occupied_and_refusals("h1")[1] == {"a": ("b", "c")}
    assert reader.occupied_and_refusals("h2")[1] == {"z": ("a",)}
    writer.set_state("a", "removed")  # holds nothing any more: refuses nothing either
    assert reader.occupied_and_refusals("h1")[1] == {}
    writer.set_state("a", "running")
    assert reader.occupied_and_refusals("h1")[1] == {"a": ("b", "c")}
    writer.forget("a")
    assert reader.occupied_and_refusals("h1")[1] == {}


def test_every_host_s_records_in_one_read_follow_what_another_instance_writes(two_instances):
    """The dry runs' read of every host at once (one grouped query, then only the hosts whose rows
    changed) says what reading each host alone says, after inserts, updates and deletes."""
    reader, writer, sessions = two_instances

    def every() -> dict[str, list[str]]:
        found = {host: [p.guest for p in placements]
                 for host, (placements, _) in reader.every_host_occupied_and_refusals().items()}
        for host in ("h1", "h2", "h3"):
            assert found.get(host, []) == [p.guest for p in reader.occupied(host)], host
        return found

    assert every() == {}
    writer.record("h1", "test:///h1", _pinned("a", {0}), {"anti_affinity": ["b"]})
    writer.record("h2", "test:///h2", _pinned("z", {0}, "h2"), {})
    assert every() == {"h1": ["a"], "h2": ["z"]}
    assert reader.every_host_occupied_and_refusals()["h1"][1] == {"a": ("b",)}
    SqlPlacementUpdates(sessions[1], {"h1": "test:///h1"}).apply([_pinned("a", {3})])
    assert reader.every_host_occupied_and_refusals()["h1"][0][0].vcpupin == {0: frozenset({3})}
    writer.forget("z")
    writer.record("h3", "test:///h3", _pinned("y", {1}, "h3"), {})
    assert every() == {"h1": ["a"], "h3": ["y"]}
