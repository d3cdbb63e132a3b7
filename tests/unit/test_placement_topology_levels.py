"""Placement on the topology levels the readers now see: dies, CPU-less memory nodes, offline nodes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vmplacer.adapters.capabilities import parse_capabilities
from vmplacer.adapters.sysfs import read_sysfs
from vmplacer.core.placement.allocate import NoFit, allocate
from vmplacer.core.topology.assemble import CacheFacts, CpuFacts, assemble_topology
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.occupancy import memory_by_node
from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.placement.scoring import LocalityScorer
from vmplacer.core.topology.host import HostTopology, Node

CAPS_DIR = Path(__file__).resolve().parents[1] / "data" / "capabilities"
GIB_KIB = 1024 * 1024


def two_dies_two_llcs_each() -> HostTopology:
    """One node, one package, 2 dies x 2 LLCs x 4 cores, no SMT: CPUs 0-7 on die 0, 8-15 on die 1."""
    facts = [CpuFacts(i, 0, package=0, die=i // 8, core_id=i % 8, siblings=frozenset({i})) for i in range(16)]
    caches = [CacheFacts(3, frozenset(range(start, start + 4))) for start in (0, 4, 8, 12)]
    return assemble_topology(facts, {0: Node(0, 64 * GIB_KIB, 64 * GIB_KIB)}, caches, name="dies")


def owner(name: str, cpus: set[int], host: str = "dies") -> Placement:
    return Placement(guest=name, host=host, vcpupin={i: frozenset({c}) for i, c in enumerate(sorted(cpus))},
                     memory_nodes=frozenset({0}), memory_kib=GIB_KIB, dedicated=True, exclusive_cpus=frozenset(cpus))


def cell_placement(cpus: list[int]) -> Placement:
    pins = {i: frozenset({c}) for i, c in enumerate(cpus)}
    return Placement(guest="g", host="dies", vcpupin=pins, memory_nodes=frozenset({0}), memory_kib=GIB_KIB,
                     cells=(GuestCell(0, frozenset(pins), GIB_KIB, 0),), dedicated=True, exclusive_cpus=frozenset(cpus))


def test_a_cell_too_big_for_one_llc_stays_on_one_die():
    topology = two_dies_two_llcs_each()
    # Free: die 0 has 3 + 3 cores, die 1 has 4 + 1: the largest LLC is on die 1, but only die 0 holds 6.
    others = [owner("a", {0}), owner("b", {4}), owner("c", {12, 13, 14})]
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 6, "memory_mib": 1024, "cpu_policy": "dedicated",
                                    "thread_policy": "isolate"})
    placement = allocate(topology, guest, others)
    assert {topology.cpus[c].die for c in placement.pcpus} == {0}
    assert placement.pcpus == {1, 2, 3, 5, 6, 7}


def test_locality_prefers_one_die_when_a_cell_spans_llcs():
    topology = two_dies_two_llcs_each()
    scorer = LocalityScorer()
    one_die = scorer.score(topology, cell_placement([0, 1, 2, 4, 5, 6]), [])
    two_dies = scorer.score(topology, cell_placement([0, 1, 2, 8, 9, 10]), [])
    one_llc = scorer.score(topology, cell_placement([0, 1, 2, 3]), [])
    assert one_llc > one_die > two_dies
    # 0.7 for the node, 0.3 x (LLC share x die share).
    assert one_die == pytest.approx(0.7 + 0.3 * 0.5)
    assert two_dies == pytest.approx(0.7 + 0.3 * 0.5 * 0.5)


def test_without_cache_banks_a_multi_die_host_keeps_a_guest_on_one_die():
    xml = (CAPS_DIR / "epyc-4die-llc.xml").read_text()
    topology = parse_capabilities(re.sub(r"\s*<cache>.*</cache>", "", xml, flags=re.S), name="epyc")
    others = [owner("a", {0, 16, 1, 17}, host="epyc")]  # half of die 0 (CPUs 0-3, 16-19)
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 8, "memory_mib": 1024, "cpu_policy": "dedicated"})
    placement = allocate(topology, guest, others)
    assert len({topology.cpus[c].die for c in placement.pcpus}) == 1
    assert len(topology.llc_groups) == 4


# ----- CPU-less memory nodes -----------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_host(sysfs_roots) -> HostTopology:
    return read_sysfs(sysfs_roots["arm-gpu-memory"], name="gpu")


def test_guests_never_get_memory_on_cpuless_nodes(gpu_host):
    placed: list[Placement] = []
    for index, fields in enumerate([
        {"vcpus": 4, "memory_mib": 32768},
        {"vcpus": 2, "memory_mib": 16384, "cpu_policy": "dedicated"},
        {"vcpus": 8, "memory_mib": 40960, "mem_page_size": "any"},
        {"vcpus": 2, "memory_mib": 8192, "numa_nodes": 1},
        {"vcpus": 1, "memory_mib": 1024, "workload_class": "latency-critical"},
    ]):
        placed.append(allocate(gpu_host, GuestSpec.from_mapping({"name": f"g{index}", **fields}), placed))
    assert all(p.memory_nodes == {0} and {c.host_node for c in p.cells} == {0} for p in placed)


def test_a_guest_bigger_than_the_cpu_nodes_memory_is_refused_not_spilled(gpu_host):
    guest = GuestSpec.from_mapping({"name": "big", "vcpus": 2, "memory_mib": 200 * 1024})  # host: 472 GiB
    with pytest.raises(NoFit) as info:
        allocate(gpu_host, guest)
    reasons = {(r.constraint, r.where, r.have) for r in info.value.reasons}
    assert reasons == {("numa-cells", "host", "1 nodes with CPUs"), ("memory", "cell 0 on node 0", "102400 MiB free")}


def test_unpinned_memory_is_counted_on_cpu_nodes_and_named_nodes_where_named(gpu_host):
    anywhere = Placement(guest="foreign", host="gpu", vcpupin={0: frozenset()}, memory_kib=GIB_KIB)
    assert memory_by_node(gpu_host, anywhere) == {0: GIB_KIB}
    named = Placement(guest="tiered", host="gpu", vcpupin={0: frozenset({3})}, memory_nodes=frozenset({1}),
                      memory_kib=GIB_KIB)
    assert memory_by_node(gpu_host, named) == {1: GIB_KIB}


# ----- a node that went offline with its CPUs ---------------------------------------------------

def test_an_offline_node_gets_no_guest(sysfs_roots):
    topology = read_sysfs(sysfs_roots["cpu0-offline-node0"], name="half")
    placed: list[Placement] = []
    for index in range(3):
        guest = GuestSpec.from_mapping({"name": f"g{index}", "vcpus": 2, "memory_mib": 2048,
                                        "cpu_policy": "dedicated"})
        placed.append(allocate(topology, guest, placed))
    assert all(p.memory_nodes == {1} and p.pcpus <= set(range(4, 12)) for p in placed)
