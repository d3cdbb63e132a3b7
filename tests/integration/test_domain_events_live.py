"""Placing's view of a real libvirtd's domains (QEMU driver) follows what another client does:
a running guest re-pinned live through a separate connection is seen once libvirt's event for
it is in, without any resync; and whatever happens, by the first read `domain_resync_s` after
the last full one. The clock is a fake one, so the resync bound is the setting itself, not a
guess at how long anything takes.
"""

from __future__ import annotations

import libvirt
import pytest

from vmplacer.adapters.libvirt_host import LibvirtHost
from vmplacer.config import HostSettings

pytestmark = pytest.mark.integration

RESYNC_S = 5.0
EVENT_TIMEOUT_S = 60.0  # only how long a missing event is waited for before failing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _two_pcpus(conn: libvirt.virConnect) -> tuple[int, int]:
    count = conn.getCPUMap(0)[0]
    assert count >= 2, "the testbed host needs two pCPUs"
    return 0, count - 1


def _cpumap(conn: libvirt.virConnect, cpu: int) -> tuple[bool, ...]:
    return tuple(i == cpu for i in range(conn.getCPUMap(0)[0]))


@pytest.fixture
def watched(testbed, host1_conn):  # type: ignore[no-untyped-def]
    clock = Clock()
    host = LibvirtHost(HostSettings("h1", testbed.host1_uri, domain_resync_s=RESYNC_S), clock=clock)
    host.placements()  # connected, one full read (events are asked for from the second read on)
    host.placements()  # watching now, another full read
    assert host.domain_events.watching, "libvirtd must deliver domain events to this connection"
    yield host, clock
    host.close()


def test_a_live_re_pin_through_another_connection_is_seen_once_its_event_is_in(watched, host1_conn, make_guest):
    host, clock = watched
    first, last = _two_pcpus(host1_conn)
    seen = host.domain_events.events_seen
    guest = make_guest("evpin", pin=first)  # defined and started by another client
    assert host.domain_events.wait_for_events(seen, EVENT_TIMEOUT_S)
    assert host.placements()[guest.name].vcpupin == {0: frozenset({first})}

    seen = host.domain_events.events_seen
    host1_conn.lookupByName(guest.name).pinVcpuFlags(0, _cpumap(host1_conn, last), libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert host.domain_events.wait_for_events(seen, EVENT_TIMEOUT_S), "no TUNABLE event for a live re-pin"
    assert host.placements()[guest.name].vcpupin == {0: frozenset({last})}  # the clock has not moved


def test_any_outside_re_pin_is_seen_by_the_first_read_resync_s_after_the_last_full_one(watched, host1_conn,
                                                                                       make_guest):
    host, clock = watched
    first, last = _two_pcpus(host1_conn)
    guest = make_guest("evsync", pin=first)
    clock.now += RESYNC_S
    assert host.placements()[guest.name].vcpupin == {0: frozenset({first})}  # a full read

    # The persistent definition and the live guest both re-pinned, whether or not an event comes.
    dom = host1_conn.lookupByName(guest.name)
    dom.pinVcpuFlags(0, _cpumap(host1_conn, last), libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    clock.now += RESYNC_S
    assert host.placements()[guest.name].vcpupin == {0: frozenset({last})}

    dom.destroy()  # shut off: the definition is what placing reads; re-pinned there alone (no event)
    dom.pinVcpuFlags(0, _cpumap(host1_conn, first), libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    clock.now += RESYNC_S
    assert host.placements()[guest.name].vcpupin == {0: frozenset({first})}
