"""Host choice through the API's host snapshots remembers the fleet's rooms and each guest
shape's dry run while no snapshot changes, and answers exactly as a survey that remembers
nothing; a change on any host (a write's invalidation, a refresh that read something new)
is seen by the next guest."""

from __future__ import annotations

from dataclasses import replace

from tests.unit.test_fleet_survey import NoRecords, _fleet
from vmplacer.api.hostcache import HostSnapshots, SnapshotStore
from vmplacer.app.place.fleet_placement import FleetPlacement, SurveyMemo
from vmplacer.app.place.placement_service import PlacementService
from vmplacer.core.placement.allocate import allocate
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.ports import DomainInfo


def render(spec, placement, base):  # type: ignore[no-untyped-def]
    return f"<domain><name>{spec.name}</name></domain>"


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def remembering(hosts, clock):  # type: ignore[no-untyped-def]
    snapshots = HostSnapshots(hosts.__getitem__, lambda _name: ([], {}), clock=clock)
    service = PlacementService(SnapshotStore(snapshots), render)
    counts = {"room": 0, "allocate": 0}
    room, allocate_on = service.room, service._allocate

    def counted_room(host):  # type: ignore[no-untyped-def]
        counts["room"] += 1
        return room(host)

    def counted_allocate(*args):  # type: ignore[no-untyped-def]
        counts["allocate"] += 1
        return allocate_on(*args)

    service.room = counted_room  # type: ignore[method-assign]
    service._allocate = counted_allocate  # type: ignore[method-assign]
    memo = SurveyMemo()
    fleet = FleetPlacement(service, snapshots.view, hosts.__getitem__, hosts_to_score=4, memo=memo,
                           changes=snapshots.changes)
    return fleet, snapshots, counts


def forgetting(hosts):  # type: ignore[no-untyped-def]
    service = PlacementService(NoRecords(), render)
    return FleetPlacement(service, hosts.__getitem__, hosts.__getitem__, hosts_to_score=4)


def guest(name: str) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": 2, "memory_mib": 2048, "cpu_policy": "dedicated"})


def test_remembered_answers_are_the_answers_and_a_change_is_seen():
    hosts = _fleet()
    names = sorted(hosts)
    fleet, snapshots, counts = remembering(hosts, Clock())

    first = fleet.plan(guest("a"), names, None)
    rooms_read, allocations = counts["room"], counts["allocate"]
    assert rooms_read >= len(names)
    second = fleet.plan(guest("b"), names, None)
    assert counts["room"] == rooms_read and counts["allocate"] == allocations  # nothing read or allocated again
    assert second.result.placement == replace(first.result.placement, guest="b") and second.host == first.host
    assert second.result.placement.guest == "b"
    assert forgetting(hosts).plan(guest("b"), names, None).result.placement == second.result.placement

    # a guest lands on the chosen host: its snapshot is dropped, and the next guest sees the new guest
    host = hosts[first.host]
    landed = allocate(host.topology(), guest("a"), [d.placement for d in host.domains()])
    host._domains.append(DomainInfo("a", "u-a", "running", None, landed.vcpus, landed.memory_kib, landed))
    snapshots.invalidate(first.host)
    third = fleet.plan(guest("c"), names, None)
    assert counts["room"] > rooms_read
    assert third.result.placement == forgetting(hosts).plan(guest("c"), names, None).result.placement
    if third.host == first.host:
        assert not third.result.placement.exclusive_cpus & landed.exclusive_cpus


def test_a_guest_a_neighbour_refuses_by_name_is_planned_anew():
    hosts = _fleet()
    names = sorted(hosts)
    fleet, _snapshots, counts = remembering(hosts, Clock())
    fleet.plan(guest("a"), names, None)
    chosen = fleet.plan(guest("b"), names, None).host
    allocations = counts["allocate"]
    host = hosts[chosen]
    topology = host.topology()
    picky = allocate(topology, GuestSpec.from_mapping({"name": "picky", "vcpus": 1, "memory_mib": 512,
                                                         "cpu_policy": "dedicated", "anti_affinity": ["victim"]}),
                     [d.placement for d in host.domains()])
    host._domains.append(DomainInfo("picky", "u-picky", "running", None, 1, picky.memory_kib, picky))
    host._domains = list(host._domains)
    _snapshots.invalidate(chosen)
    answer = fleet.plan(guest("victim"), names, None)
    assert counts["allocate"] > allocations
    assert answer.result.placement == forgetting(hosts).plan(guest("victim"), names, None).result.placement
