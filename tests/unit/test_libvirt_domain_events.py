"""Dirty marks of a host's domains (`DomainEvents`) with a fake connection and clock: when a
read must re-read everything, which domains it must re-read, and that no mark is lost to a
read running while it is set or to a read that fails."""

from __future__ import annotations

import libvirt
import pytest

from vmplacer.adapters.libvirt_domain_events import WATCHED_EVENTS, DomainEvents


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeDomain:
    def __init__(self, name: str | None):
        self._name = name

    def name(self) -> str:
        if self._name is None:
            raise libvirt.libvirtError("domain vanished")
        return self._name


class FakeConnection:
    """Records what is registered; `refuse_after` registrations succeed, then libvirt refuses."""

    def __init__(self, refuse_after: int | None = None):
        self.callbacks: dict[int, object] = {}
        self.close_callback: object | None = None
        self.refuse_after = refuse_after

    def domainEventRegisterAny(self, dom, event, callback, opaque):  # type: ignore[no-untyped-def]
        if self.refuse_after is not None and len(self.callbacks) >= self.refuse_after:
            raise libvirt.libvirtError("no event support")
        self.callbacks[len(self.callbacks) + 1] = (event, callback)
        return len(self.callbacks)

    def domainEventDeregisterAny(self, callback_id: int) -> None:
        del self.callbacks[callback_id]

    def registerCloseCallback(self, callback, opaque):  # type: ignore[no-untyped-def]
        self.close_callback = callback

    def unregisterCloseCallback(self) -> None:
        self.close_callback = None

    def emit(self, name: str | None) -> None:
        for _, callback in list(self.callbacks.values()):
            callback(self, FakeDomain(name), 0, 0, None)  # type: ignore[operator]
            return  # one event: each registered kind calls the same marker


@pytest.fixture
def watched():  # type: ignore[no-untyped-def]
    clock = Clock()
    events = DomainEvents("h1", resync_s=5.0, clock=clock)
    conn = FakeConnection()
    assert events.watch(conn)  # type: ignore[arg-type]
    assert sorted(event for event, _ in conn.callbacks.values()) == sorted(WATCHED_EVENTS)
    assert events.take() == (True, frozenset())  # the first read after connecting reads everything
    return events, conn, clock


def test_a_read_re_reads_only_the_domains_marked_since_the_last_one(watched):
    events, conn, clock = watched
    assert events.take() == (False, frozenset())
    conn.emit("web1")
    events.mark("db1")  # an own change
    assert events.events_seen == 1
    assert (events.events_about("web1"), events.events_about("db1")) == (1, 0)  # own changes are no events
    assert events.wait_for_events(0, 0.0, about="web1")
    assert not events.wait_for_events(0, 0.0, about="db1")
    assert events.take() == (False, frozenset({"web1", "db1"}))
    assert events.take() == (False, frozenset())


def test_every_domain_is_re_read_resync_s_after_the_last_full_read(watched):
    events, conn, clock = watched
    clock.now += 4.999
    assert events.take()[0] is False
    clock.now += 0.001
    assert events.take() == (True, frozenset())
    clock.now += 4.999  # counted from that full read
    assert events.take()[0] is False


def test_a_mark_set_while_a_read_runs_is_kept_for_the_next_read(watched):
    events, conn, clock = watched
    conn.emit("web1")
    assert events.take() == (False, frozenset({"web1"}))  # the read starts ...
    conn.emit("web1")  # ... and web1 changes again while it reads
    assert events.take() == (False, frozenset({"web1"}))


def test_a_failed_read_gives_back_what_it_took(watched):
    events, conn, clock = watched
    conn.emit("web1")
    full, dirty = events.take()
    conn.emit("db1")
    events.give_back(full, dirty)
    assert events.take() == (False, frozenset({"web1", "db1"}))
    clock.now += 5
    full, dirty = events.take()
    events.give_back(full, dirty)
    assert events.take() == (True, frozenset())  # the failed full read is still owed


def test_a_lost_connection_or_a_nameless_event_makes_the_next_read_full(watched):
    events, conn, clock = watched
    conn.emit(None)  # the domain is gone before its name could be read
    assert events.take() == (True, frozenset())
    conn.close_callback(conn, 0, None)  # type: ignore[misc]
    assert not events.watching
    assert events.take()[0] is True
    assert events.take()[0] is True  # and every read after it, until a connection is watched again


def test_unwatching_deregisters_and_the_next_read_is_full(watched):
    events, conn, clock = watched
    events.unwatch(conn)  # type: ignore[arg-type]
    assert conn.callbacks == {} and conn.close_callback is None
    assert events.take()[0] is True


def test_without_events_every_read_is_full():
    events = DomainEvents("h1", resync_s=5.0, clock=Clock())
    conn = FakeConnection(refuse_after=2)
    assert not events.watch(conn)  # type: ignore[arg-type]
    assert conn.callbacks == {}  # what was registered before libvirt refused is taken back
    assert [events.take()[0] for _ in range(3)] == [True, True, True]


def test_resync_zero_watches_nothing_and_reads_everything():
    events = DomainEvents("h1", resync_s=0, clock=Clock())
    conn = FakeConnection()
    assert not events.watch(conn)  # type: ignore[arg-type]
    assert conn.callbacks == {}
    assert [events.take()[0] for _ in range(3)] == [True, True, True]


def test_a_negative_resync_interval_names_the_host():
    with pytest.raises(ValueError, match="host h1: domain resync interval must be >= 0 s, got -1"):
        DomainEvents("h1", resync_s=-1)
