"""A host's usage extended from the previous one equals the usage rebuilt from scratch."""

from __future__ import annotations

import dataclasses

from vmplacer.core.placement.occupancy import HostUsage, Occupancy, occupancy_after
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import uniform_topology


def _usage_fields(usage: HostUsage) -> dict:
    return {f.name: getattr(usage, f.name) for f in dataclasses.fields(usage) if f.name not in ("_index", "topology")}


def _shared(name: str, cpus: set[int]) -> Placement:
    return Placement(guest=name, host="h", vcpupin={0: frozenset(cpus)}, memory_kib=4096)


def _dedicated(name: str, cpu: int) -> Placement:
    return Placement(guest=name, host="h", vcpupin={0: frozenset({cpu})}, memory_kib=8192, dedicated=True,
                     exclusive_cpus=frozenset({cpu}))


def _seeded(topology, placements) -> Occupancy:  # type: ignore[no-untyped-def]
    occupancy = Occupancy(placements)
    occupancy.usage(topology)
    return occupancy


def test_new_guests_extend_the_previous_usage_without_touching_it():
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2)
    first = [_shared("a", {0, 1}), _dedicated("b", 5)]
    previous = _seeded(topology, first)
    before = _usage_fields(previous.usage(topology))
    now = [*first, _dedicated("c", 9), _shared("d", set())]
    extended = occupancy_after(previous, topology, now)
    assert "_usage" in extended.__dict__  # extended, not left to be rebuilt
    assert _usage_fields(extended.usage(topology)) == _usage_fields(HostUsage.build(topology, now))
    assert _usage_fields(previous.usage(topology)) == before


def test_a_removed_or_changed_guest_rebuilds():
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2)
    first = [_shared("a", {0, 1}), _dedicated("b", 5)]
    previous = _seeded(topology, first)
    for now in ([first[0]], [first[0], _dedicated("b", 6)], [_shared("a", {2}), first[1], _dedicated("c", 9)]):
        rebuilt = occupancy_after(previous, topology, now)
        assert "_usage" not in rebuilt.__dict__
        assert _usage_fields(rebuilt.usage(topology)) == _usage_fields(HostUsage.build(topology, now))


def test_an_equal_copy_counts_as_unchanged_and_another_layout_rebuilds():
    topology = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2)
    previous = _seeded(topology, [_dedicated("b", 5)])
    assert "_usage" in occupancy_after(previous, topology, [_dedicated("b", 5)]).__dict__
    reread = uniform_topology(nodes=2, cores_per_node=4, threads_per_core=2)  # same layout, read anew
    extended = occupancy_after(previous, reread, [_dedicated("b", 5), _dedicated("c", 6)])
    assert extended.usage(reread).topology is reread
    other = uniform_topology(nodes=2, cores_per_node=5, threads_per_core=2)
    assert "_usage" not in occupancy_after(previous, other, [_dedicated("b", 5)]).__dict__
    assert "_usage" not in occupancy_after(None, topology, [_dedicated("b", 5)]).__dict__
