"""The isolation invariant (core/placement/isolation.py): exclusive pCPUs stay exclusive, and the
narrowing that placing does (refresh_shared_pins) always restores it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.allocation_fixtures import TOPOLOGIES
from vmplacer.core.placement.allocate import NoFit, allocate, refresh_shared_pins
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.isolation import isolation_violations
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.reconcile import isolation_findings
from vmplacer.core.topology.host import uniform_topology


def guest(name: str, vcpus: int, **fields: object) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": vcpus, "memory_mib": 256, **fields})


def two_pcpus():  # type: ignore[no-untyped-def]
    """The host of the report: pCPUs 0 and 1, no SMT."""
    return uniform_topology(nodes=1, cores_per_node=2, threads_per_core=1, memory_mib_per_node=4096, name="tiny")


def test_a_shared_guest_placed_first_leaves_the_dedicated_pcpu_with_its_emulator_too():
    topology = two_pcpus()
    shared = allocate(topology, guest("shared", 1))
    assert shared.vcpupin[0] == frozenset({0, 1}) and shared.emulatorpin == frozenset({0, 1})
    owner = allocate(topology, guest("owner", 1, cpu_policy="dedicated"), [shared])
    before = isolation_violations(topology, [shared, owner])
    assert {(v.guest, v.thread, v.owner) for v in before} == {("shared", "vCPU 0", "owner"),
                                                              ("shared", "emulator", "owner")}
    narrowed = refresh_shared_pins(topology, [shared, owner])
    assert isolation_violations(topology, narrowed) == []
    free = frozenset({0, 1}) - owner.exclusive_cpus
    assert narrowed[0].vcpupin[0] == free and narrowed[0].emulatorpin == free


def test_an_emulator_that_ran_anywhere_floats_with_the_vcpus():
    topology = two_pcpus()
    owner = allocate(topology, guest("owner", 1, cpu_policy="dedicated"))
    foreign = Placement(guest="foreign", host=owner.host, vcpupin={0: frozenset()}, memory_kib=1024)
    assert {v.thread for v in isolation_violations(topology, [foreign, owner])} == {"vCPU 0", "emulator"}
    narrowed = refresh_shared_pins(topology, [foreign, owner])
    assert isolation_violations(topology, narrowed) == []
    assert narrowed[0].emulatorpin == narrowed[0].vcpupin[0] == frozenset({0, 1}) - owner.exclusive_cpus


def test_reserved_pcpus_are_off_limits_except_to_emulators_sent_there():
    topology = two_pcpus().with_reserved({0})
    on_reserved = Placement(guest="g", host="tiny", vcpupin={0: frozenset({0, 1})}, emulatorpin=frozenset({0}),
                            memory_kib=1024)
    found = isolation_violations(topology, [on_reserved])
    assert [(v.thread, v.owner, sorted(v.cpus)) for v in found] == [("vCPU 0", "", [0]), ("emulator", "", [0])]
    assert "reserved for the host" in found[0].describe()
    # the host's emulator_cpus send emulator threads to reserved pCPUs: allowed there
    allowed = isolation_violations(topology, [on_reserved], emulator_cpus=frozenset({0}))
    assert [v.thread for v in allowed] == ["vCPU 0"]


def test_a_dedicated_guest_s_own_emulator_on_its_own_pcpus_is_no_violation():
    topology = TOPOLOGIES["dual-smt"]()
    placed: list[Placement] = []
    for name, fields in (("a", {"cpu_policy": "dedicated", "emulator_threads": "isolate"}),
                         ("b", {"cpu_policy": "dedicated"}), ("c", {"cpu_policy": "mixed", "dedicated_vcpus": "1"}),
                         ("d", {})):
        placed.append(allocate(topology, guest(name, 2, **fields), placed))
    assert isolation_violations(topology, placed) == []


def test_reconcile_names_a_domain_pinned_by_hand_onto_an_owned_pcpu():
    topology = two_pcpus()
    owner = allocate(topology, guest("owner", 1, cpu_policy="dedicated"))
    shared = allocate(topology, guest("shared", 1), [owner])

    class Live:
        def __init__(self, placement: Placement) -> None:
            self.name, self.uuid, self.state, self.placement = placement.guest, "u", "running", placement

    class Record:
        def __init__(self, placement: Placement) -> None:
            self.guest, self.state, self.domain_uuid, self.placement, self.age_s = (
                placement.guest, "running", "u", placement, 600.0)

    by_hand = replace(shared, vcpupin={0: owner.exclusive_cpus})
    findings = isolation_findings("tiny", topology, [Record(owner), Record(shared)], [Live(owner), Live(by_hand)])
    assert [(f.guest, f.kind, f.action) for f in findings] == [("shared", "isolation", "none")]
    assert "exclusive to guest owner" in findings[0].detail
    assert isolation_findings("tiny", topology, [Record(owner), Record(shared)], [Live(owner), Live(shared)]) == []


# ----- random sequences of operations ---------------------------------------------------------------------
OPERATIONS = st.lists(st.tuples(
    st.sampled_from(["place", "remove", "repin"]),
    st.integers(1, 3),  # vCPUs
    st.sampled_from(["shared", "dedicated", "mixed"]),
    st.integers(0, 10**6),  # which guest (remove, repin)
), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(TOPOLOGIES)), operations=OPERATIONS)
def test_after_every_operation_narrowing_keeps_the_invariant(name, operations):
    """place / remove / repin (a floater widened back over the node, as by hand), each followed
    by the narrowing placing does: never a thread on another's exclusive or a reserved pCPU."""
    topology = TOPOLOGIES[name]()
    placed: list[Placement] = []
    for step, (operation, vcpus, policy, pick) in enumerate(operations):
        if operation == "place":
            fields: dict[str, object] = {"cpu_policy": policy}
            if policy == "mixed":
                if vcpus < 2:
                    continue
                fields["dedicated_vcpus"] = "1"
            try:
                placed.append(allocate(topology, guest(f"g{step}", vcpus, **fields), placed))
            except NoFit:
                continue
        elif operation == "remove" and placed:
            placed.pop(pick % len(placed))
        elif operation == "repin" and placed:
            index = pick % len(placed)
            floating = placed[index]
            if floating.exclusive_cpus:
                continue
            anywhere = frozenset(topology.usable_cpus)
            placed[index] = replace(floating, vcpupin={v: anywhere for v in floating.vcpupin}, emulatorpin=frozenset())
        placed = refresh_shared_pins(topology, placed)
        assert isolation_violations(topology, placed) == [], (operation, [p.guest for p in placed])


def test_an_iothread_pinned_onto_an_owned_pcpu_is_a_violation_and_drift_from_its_emulator():
    from vmplacer.core.reconcile import describe_drift

    topology = two_pcpus()
    owner = allocate(topology, guest("owner", 1, cpu_policy="dedicated"))
    shared = refresh_shared_pins(topology, [allocate(topology, guest("shared", 1), [owner]), owner])[0]
    free = shared.emulatorpin
    assert isolation_violations(topology, [replace(shared, iothreadpin={1: free}), owner]) == []
    strayed = replace(shared, iothreadpin={1: owner.exclusive_cpus})
    found = isolation_violations(topology, [strayed, owner])
    assert [(v.guest, v.thread, v.owner) for v in found] == [("shared", "iothread 1", "owner")]
    # the record keeps no IOThread pins: they belong with the emulator threads
    assert describe_drift(shared, replace(shared, iothreadpin={1: free})) == ""
    assert "IOThread pins 1→" in describe_drift(shared, strayed)
