"""A libvirt host's domains as placing reads them, kept from libvirt's domain events, on the
test driver: what others change through their own connection is seen once its event is in,
a change without an event (or whose event was lost) at the next resync, and vmplacer's own
changes at once. The clock is a fake one: a resync happens when the test moves it.

One process has one test:///default state, shared by every connection opened in it: the
second connection here stands for anyone else changing the host.
"""

from __future__ import annotations

import pytest

from tests.functional.test_api_helpers import roomy_test_driver
from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.config import HostSettings

RESYNC_S = 5.0
EVENT_TIMEOUT_S = 30.0  # only how long a missing event is waited for before failing
THEIRS_UUID = "0b7e8c52-64f7-4d0e-9a51-3c1f1d2e7a01"
BARRIER_UUID = "0b7e8c52-64f7-4d0e-9a51-3c1f1d2e7aff"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _xml(name: str, pins: list[int], uuid: str = THEIRS_UUID) -> str:
    pinning = "".join(f"<vcpupin vcpu='{v}' cpuset='{c}'/>" for v, c in enumerate(pins))
    return (f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory>16384</memory>"
            f"<vcpu>{len(pins)}</vcpu><cputune>{pinning}</cputune><os><type>hvm</type></os></domain>")


@pytest.fixture
def setup():  # type: ignore[no-untyped-def]
    with roomy_test_driver() as other:
        clock = Clock()
        host = LibvirtHost(HostSettings("t", "test:///default", domain_resync_s=RESYNC_S), clock=clock)
        assert host.placements() == {}  # connected, read once (a full read): not watching yet
        assert not host.domain_events.watching  # a one-shot reader never registers callbacks
        assert host.placements() == {}  # the second read asks for events (and reads all again)
        assert host.domain_events.watching
        _barrier(host, other)  # events of earlier changes (the last test's clean-up) are in
        yield host, other, clock
        host.close()


def _pins(host: LibvirtHost, name: str) -> dict[int, frozenset[int]]:
    return host.placements()[name].vcpupin


def _barrier(host: LibvirtHost, other) -> None:  # type: ignore[no-untyped-def]
    """Define and undefine a domain of its own through the other connection and wait for its
    second event: the driver delivers events in order, so every event of an earlier change has
    arrived too, and none can come after a read and mark a domain the test expects unread."""
    seen = host.domain_events.events_about("barrier")
    other.defineXML(_xml("barrier", [0], uuid=BARRIER_UUID)).undefine()
    assert host.domain_events.wait_for_events(seen + 1, EVENT_TIMEOUT_S, about="barrier"), "no domain event arrived"


def _outside(host: LibvirtHost, other, change) -> None:  # type: ignore[no-untyped-def]
    """Make a change through the other connection and wait until all its events are in."""
    seen = host.domain_events.events_seen
    change()
    assert host.domain_events.wait_for_events(seen, EVENT_TIMEOUT_S), "no domain event arrived"
    _barrier(host, other)


def _drop_events(host: LibvirtHost) -> None:
    """Events from now on are lost: libvirt no longer delivers them (the host still believes it
    watches, as when an event goes missing without the connection failing)."""
    conn = host.connection()
    callbacks = host.domain_events._callbacks
    while callbacks:  # taken off the host's list too: its close must not deregister them again
        conn.domainEventDeregisterAny(callbacks.pop())


def test_an_outside_define_redefine_and_undefine_are_seen_once_their_event_is_in(setup):
    host, other, clock = setup
    _outside(host, other, lambda: other.defineXML(_xml("theirs", [3, 4])))
    assert _pins(host, "theirs") == {0: {3}, 1: {4}}

    _outside(host, other, lambda: other.defineXML(_xml("theirs", [5, 6])))  # same name and UUID, re-pinned
    assert _pins(host, "theirs") == {0: {5}, 1: {6}}  # no resync: the clock has not moved

    _outside(host, other, lambda: other.lookupByName("theirs").undefine())
    assert "theirs" not in host.placements()


def test_an_outside_live_re_pin_without_an_event_is_seen_at_the_resync(setup):
    host, other, clock = setup
    _outside(host, other, lambda: other.defineXML(_xml("theirs", [3])))
    _outside(host, other, lambda: other.lookupByName("theirs").create())
    assert _pins(host, "theirs") == {0: {3}}

    seen = host.domain_events.events_seen
    other.lookupByName("theirs").pinVcpu(0, tuple(c == 7 for c in range(16)))  # the test driver sends no event
    assert _pins(host, "theirs") == {0: {3}}  # not seen yet: its last read is kept
    clock.now += RESYNC_S - 0.001
    assert _pins(host, "theirs") == {0: {3}}
    clock.now += 0.001
    assert _pins(host, "theirs") == {0: {7}}  # the resync re-read every domain
    assert host.domain_events.events_seen == seen


def test_a_lost_event_is_healed_by_the_resync(setup):
    host, other, clock = setup
    _outside(host, other, lambda: other.defineXML(_xml("theirs", [3])))
    assert _pins(host, "theirs") == {0: {3}}
    _drop_events(host)

    other.defineXML(_xml("theirs", [9]))
    other.defineXML(_xml("new", [10], uuid="0b7e8c52-64f7-4d0e-9a51-3c1f1d2e7a02"))
    placements = host.placements()
    assert placements["theirs"].vcpupin == {0: {3}}  # its event was lost
    assert placements["new"].vcpupin == {0: {10}}  # a domain not listed before is read all the same
    clock.now += RESYNC_S
    assert _pins(host, "theirs") == {0: {9}}


def test_own_changes_are_seen_at_once_without_their_event(setup):
    host, other, clock = setup
    host.define(_xml("ours", [1, 2]), "ours")
    assert _pins(host, "ours") == {0: {1}, 1: {2}}
    _drop_events(host)

    host.define(_xml("ours", [11, 12]), "ours")  # redefined by vmplacer: marked when it returns
    assert _pins(host, "ours") == {0: {11}, 1: {12}}
    host.undefine("ours")
    assert "ours" not in host.placements()


def test_a_reconnect_reads_every_domain_again(setup):
    host, other, clock = setup
    _outside(host, other, lambda: other.defineXML(_xml("theirs", [3])))
    assert _pins(host, "theirs") == {0: {3}}
    _drop_events(host)
    other.defineXML(_xml("theirs", [8]))
    assert _pins(host, "theirs") == {0: {3}}

    host.close()  # the next call opens a new connection: whatever happened meanwhile is unknown
    assert _pins(host, "theirs") == {0: {8}}
    assert not host.domain_events.watching  # until its second read
    assert _pins(host, "theirs") == {0: {8}}
    assert host.domain_events.watching


def test_resync_zero_reads_every_domain_every_time():
    with roomy_test_driver() as other:
        host = LibvirtHost(HostSettings("t", "test:///default", domain_resync_s=0))
        other.defineXML(_xml("theirs", [3]))
        assert _pins(host, "theirs") == {0: {3}}
        assert not host.domain_events.watching  # no events asked for
        other.lookupByName("theirs").create()
        other.lookupByName("theirs").pinVcpu(0, tuple(c == 7 for c in range(16)))  # no event, no clock
        assert _pins(host, "theirs") == {0: {7}}
        host.close()
