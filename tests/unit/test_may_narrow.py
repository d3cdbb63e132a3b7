"""`may_narrow` is the cheap check placing makes before narrowing floating pins: it may say
"maybe" too often, never "no" when `refresh_shared_pins` would change something."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tests.unit.allocation_fixtures import TOPOLOGIES
from vmplacer.core.placement.allocate import NoFit, allocate, may_narrow, refresh_shared_pins
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.isolation import isolation_violations
from vmplacer.core.placement.guest_placement import Placement


def guest(name: str, vcpus: int, **fields: object) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": vcpus, "memory_mib": 256, **fields})


def _changed(topology, placements: list[Placement]) -> bool:  # type: ignore[no-untyped-def]
    return any(after is not before for before, after in zip(placements, refresh_shared_pins(topology, placements)))


def test_shared_guests_alone_never_narrow():
    topology = TOPOLOGIES["single-smt"]()
    placed: list[Placement] = []
    for i in range(6):
        placed.append(allocate(topology, guest(f"s{i}", 2), placed))
    assert not may_narrow(placed) and not _changed(topology, placed)


def test_a_pinned_guest_after_floating_ones_is_seen():
    topology = TOPOLOGIES["single-smt"]()
    shared = allocate(topology, guest("s", 2))
    pinned = allocate(topology, guest("d", 2, cpu_policy="dedicated"), [shared])
    assert _changed(topology, [shared, pinned]) and may_narrow([shared, pinned])
    narrowed = refresh_shared_pins(topology, [shared, pinned])
    assert not may_narrow(narrowed)  # once narrowed, nothing is left to do


def test_a_foreign_domain_floating_anywhere_next_to_an_owner_is_seen():
    topology = TOPOLOGIES["single-smt"]()
    pinned = allocate(topology, guest("d", 1, cpu_policy="dedicated"))
    anywhere = Placement(guest="foreign", host=pinned.host, vcpupin={0: frozenset()}, memory_kib=1024)
    assert may_narrow([anywhere, pinned]) and _changed(topology, [anywhere, pinned])


def test_an_emulator_thread_on_a_claimed_pcpu_is_seen():
    topology = TOPOLOGIES["single-smt"]()
    pinned = allocate(topology, guest("d", 1, cpu_policy="dedicated"))
    shared = allocate(topology, guest("s", 1), [pinned])
    on_claimed = replace(shared, emulatorpin=shared.emulatorpin | pinned.exclusive_cpus)
    assert may_narrow([on_claimed, pinned]) and _changed(topology, [on_claimed, pinned])


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_never_no_when_refreshing_would_change_something(name):
    """Random mixes of shared, dedicated and foreign guests, in the order placed and shuffled."""
    topology = TOPOLOGIES[name]()
    rng = random.Random(name)
    for _ in range(40):
        placed: list[Placement] = []
        for i in range(rng.randint(1, 8)):
            spec = guest(f"g{i}", rng.randint(1, 3), cpu_policy=rng.choice(["shared", "dedicated"]))
            try:
                placed.append(allocate(topology, spec, placed))
            except NoFit:
                break
            if rng.random() < 0.2:
                placed.append(Placement(guest=f"f{i}", host=placed[0].host, vcpupin={0: frozenset()},
                                        memory_kib=1024))
        rng.shuffle(placed)
        if _changed(topology, placed):
            assert may_narrow(placed, topology.reserved), [p.guest for p in placed]
        narrowed = refresh_shared_pins(topology, placed)
        assert isolation_violations(topology, narrowed) == []
        assert not may_narrow(narrowed, topology.reserved) or not _changed(topology, narrowed)
