"""A request naming a memory-only (CPU-less) node for guest memory: validation, placement, XML.

Hosts: the capabilities fixture of an ARM machine with GPU memory (node 1) and a
CXL tier (node 2) beside its one CPU node, and a two-socket host with a CXL
node attached to each socket, built from reader facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vmplacer.adapters.capabilities import parse_capabilities
from vmplacer.adapters.domain_xml import parse_placement, render_domain
from vmplacer.core.placement.allocate import NoFit, allocate, place_on_nodes
from vmplacer.core.topology.assemble import CacheFacts, CpuFacts, assemble_topology
from vmplacer.core.placement.guest import MAX_HOST_NODE, GuestSpec, GuestSpecError
from vmplacer.core.placement.occupancy import HostUsage, memory_by_node
from vmplacer.core.placement.guest_placement import Placement, placement_from_dict
from vmplacer.core.topology.host import HostTopology, HugepagePool, Node

CAPS = Path(__file__).resolve().parents[1] / "data" / "capabilities" / "arm-gpu-memory.xml"
GIB_KIB = 1024 * 1024
MIB_PER_GIB = 1024


@pytest.fixture(scope="module")
def gpu_host() -> HostTopology:
    """Node 0: 16 CPUs, 120 GiB; node 1: 96 GiB GPU memory; node 2: 256 GiB CXL (distance 30 from 0)."""
    return parse_capabilities(CAPS.read_text(), name="gpu")


def two_sockets_with_cxl() -> HostTopology:
    """Nodes 0 and 1: 8 CPUs and 32 GiB each; CXL nodes 2 (on socket 0) and 3 (on socket 1), 64 GiB,
    2 MiB pages on node 3."""
    facts = [CpuFacts(i, i // 8, package=i // 8, die=0, core_id=i % 8, siblings=frozenset({i})) for i in range(16)]
    caches = [CacheFacts(3, frozenset(range(0, 8))), CacheFacts(3, frozenset(range(8, 16)))]
    rows = {0: (10, 21, 14, 24), 1: (21, 10, 24, 14), 2: (14, 24, 10, 26), 3: (24, 14, 26, 10)}
    nodes = {}
    for node, row in rows.items():
        memory = (32 if node < 2 else 64) * GIB_KIB
        pages = (HugepagePool(2048, 4096, 4096),) if node == 3 else ()
        nodes[node] = Node(node, memory, memory, distances={n: d for n, d in enumerate(row)}, hugepages=pages)
    return assemble_topology(facts, nodes, caches, name="cxl")


def spec(**fields) -> GuestSpec:
    return GuestSpec.from_mapping({"name": "g", "vcpus": 2, "memory_mib": 4096, **fields})


def problems(fields: dict) -> dict[str, str]:
    with pytest.raises(GuestSpecError) as info:
        GuestSpec.from_mapping({"name": "g", "vcpus": 2, "memory_mib": 4096, **fields})
    assert all(p.guest == "g" for p in info.value.problems)
    return {p.field: p.reason for p in info.value.problems}


# ----- the request field ---------------------------------------------------------------------------

def test_one_node_for_the_whole_guest_or_one_per_cell():
    whole = spec(memory_node=2)
    assert whole.memory_node == 2 and whole.memory_node_of(0) == 2 and whole.memory_node_of(5) == 2
    per_cell = spec(numa_nodes=2, memory_node={"1": 3})
    assert per_cell.memory_node is None and per_cell.cell_memory_nodes == {1: 3}
    assert (per_cell.memory_node_of(0), per_cell.memory_node_of(1)) == (None, 3)
    flat = GuestSpec.from_mapping({"name": "g", "vcpus": 2, "memory_mib": 4096, "numa_cpus.0": "0", "numa_mem.0": 1024,
                                   "numa_cpus.1": "1", "numa_mem.1": 3072, "memory_node.0": 2, "memory_node.1": 3})
    assert flat.cell_memory_nodes == {0: 2, 1: 3}


@pytest.mark.parametrize("guest", [{"memory_node": 2}, {"numa_nodes": 2, "memory_node": {0: 2, 1: 3}},
                                   {"numa_nodes": 2, "memory_node": {"1": 2}}])
def test_the_field_round_trips_through_to_dict(guest):
    value = spec(**guest)
    assert GuestSpec.from_mapping(value.to_dict()) == value
    assert "memory_node" in value.to_dict() and "memory_node" not in spec().to_dict()


@pytest.mark.parametrize("fields, field, fragment", [
    ({"memory_node": -1}, "memory_node", f"must be a host NUMA node id 0..{MAX_HOST_NODE}"),
    ({"memory_node": MAX_HOST_NODE + 1}, "memory_node", "must be a host NUMA node id"),
    ({"memory_node": True}, "memory_node", "got True"),
    ({"memory_node": "2"}, "memory_node", "got '2'"),
    ({"memory_node": [2]}, "memory_node", "got [2]"),
    ({"memory_node": {"0": 2}}, "memory_node", "per-cell nodes need the guest's cells fixed (numa_nodes"),
    ({"numa_nodes": 2, "memory_node": {"2": 3}}, "memory_node.2", "cell 2 does not exist (the guest has 2 cells: 0-1)"),
    ({"numa_nodes": 2, "memory_node": {"x": 3}}, "memory_node.x", "cell numbers must be integers"),
    ({"numa_nodes": 2, "memory_node": {"0": "3"}}, "memory_node.0", "got '3'"),
    ({"numa_nodes": 1, "memory_node": 2, "memory_node.0": 2}, "memory_node", "not both"),
])
def test_bad_values_name_the_guest_field_and_rule(fields, field, fragment):
    found = problems(fields)
    assert fragment in found[field], found


def test_unknown_field_message_lists_the_flat_form():
    assert "memory_node.N" in problems({"memory_nodes": 2})["memory_nodes"]


# ----- placement -----------------------------------------------------------------------------------

def test_memory_goes_to_the_named_node_and_the_vcpus_stay_on_a_cpu_node(gpu_host):
    guest = GuestSpec.from_mapping({"name": "tiered", "vcpus": 4, "memory_mib": 200 * MIB_PER_GIB,
                                    "cpu_policy": "dedicated", "memory_node": 2})
    placement = allocate(gpu_host, guest)
    assert [(c.host_node, c.memory_node) for c in placement.cells] == [(0, 2)]
    assert placement.memory_nodes == {2} and placement.pcpus <= gpu_host.cpus_in_node(0)
    assert memory_by_node(gpu_host, placement) == {2: 200 * GIB_KIB}
    usage = HostUsage.build(gpu_host, [placement])
    assert usage.small_free_kib(2) == 56 * GIB_KIB and usage.small_free_kib(0) == 120 * GIB_KIB
    assert placement_from_dict(placement.to_dict()) == placement


def test_memory_on_a_named_node_is_accounted_there(gpu_host):
    first = allocate(gpu_host, GuestSpec.from_mapping(
        {"name": "a", "vcpus": 2, "memory_mib": 200 * MIB_PER_GIB, "memory_node": 2}))
    # node 0 still has all of its 120 GiB: the first guest's memory is not there.
    local = allocate(gpu_host, GuestSpec.from_mapping({"name": "b", "vcpus": 2, "memory_mib": 110 * MIB_PER_GIB}),
                     [first])
    assert local.memory_nodes == {0}
    with pytest.raises(NoFit) as info:
        allocate(gpu_host, GuestSpec.from_mapping(
            {"name": "c", "vcpus": 2, "memory_mib": 100 * MIB_PER_GIB, "memory_node": 2}), [first, local])
    assert info.value.guest == "c"
    assert [(r.constraint, r.where, r.need, r.have) for r in info.value.reasons] == [
        ("memory", "memory_node 2 (cell 0)", "102400 MiB", "57344 MiB free")]


def test_a_node_with_cpus_is_refused(gpu_host):
    with pytest.raises(NoFit) as info:
        allocate(gpu_host, spec(memory_node=0))
    (reason,) = info.value.reasons
    assert (reason.constraint, reason.where, reason.need) == (
        "memory-node", "memory_node 0 (cell 0)", "a memory-only (CPU-less) node")
    assert reason.have == "node 0 with CPUs 0-15 (memory-only here: 1-2)"


def test_a_node_the_host_does_not_have_is_refused(gpu_host):
    with pytest.raises(NoFit) as info:
        allocate(gpu_host, spec(memory_node=7))
    assert [(r.constraint, r.where, r.need, r.have) for r in info.value.reasons] == [
        ("memory-node", "memory_node 7 (cell 0)", "node 7 on the host", "nodes 0-2 (memory-only: 1-2)")]
    assert "guest g does not fit on host gpu" in str(info.value)


def test_a_guest_bigger_than_its_cpu_node_fits_when_its_memory_is_named(gpu_host):
    big = {"name": "big", "vcpus": 2, "memory_mib": 200 * MIB_PER_GIB}
    with pytest.raises(NoFit):
        allocate(gpu_host, GuestSpec.from_mapping(big))  # node 0 has 120 GiB
    assert allocate(gpu_host, GuestSpec.from_mapping({**big, "memory_node": 2})).memory_nodes == {2}


def test_without_the_field_no_memory_lands_on_memory_only_nodes(gpu_host):
    placed: list[Placement] = []
    for index in range(4):
        guest = GuestSpec.from_mapping({"name": f"g{index}", "vcpus": 2, "memory_mib": 30 * MIB_PER_GIB})
        placed.append(allocate(gpu_host, guest, placed))
    assert all(p.memory_nodes == {0} and all(c.memory_node is None for c in p.cells) for p in placed)
    with pytest.raises(NoFit):  # node 0 is full; the memory-only nodes are not a spill-over
        allocate(gpu_host, GuestSpec.from_mapping({"name": "more", "vcpus": 2, "memory_mib": 30 * MIB_PER_GIB}),
                 placed)


def test_vcpus_go_to_the_socket_the_named_node_is_attached_to():
    host = two_sockets_with_cxl()
    near_one = allocate(host, spec(memory_node=3))
    assert [(c.host_node, c.memory_node) for c in near_one.cells] == [(1, 3)]
    near_zero = allocate(host, spec(memory_node=2))
    assert [(c.host_node, c.memory_node) for c in near_zero.cells] == [(0, 2)]


def test_each_cell_keeps_its_vcpus_next_to_its_own_memory_node():
    host = two_sockets_with_cxl()
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 4, "memory_mib": 8192, "numa_nodes": 2,
                                    "memory_node": {"0": 3, "1": 2}})
    placement = allocate(host, guest)
    assert sorted((c.id, c.host_node, c.memory_node) for c in placement.cells) == [(0, 1, 3), (1, 0, 2)]
    assert memory_by_node(host, placement) == {3: 4 * GIB_KIB, 2: 4 * GIB_KIB}


def test_cells_naming_one_node_share_its_room_and_other_cells_keep_theirs():
    host = two_sockets_with_cxl()
    both = {"name": "g", "vcpus": 4, "numa_nodes": 2, "memory_node": 2}
    placement = allocate(host, GuestSpec.from_mapping({**both, "memory_mib": 60 * MIB_PER_GIB}))
    assert memory_by_node(host, placement) == {2: 60 * GIB_KIB}
    with pytest.raises(NoFit) as info:
        allocate(host, GuestSpec.from_mapping({**both, "memory_mib": 70 * MIB_PER_GIB}))
    assert [(r.where, r.need) for r in info.value.reasons] == [("memory_node 2 (cells 0, 1)", "71680 MiB")]
    one = allocate(host, GuestSpec.from_mapping({"name": "h", "vcpus": 2, "memory_mib": 4096, "numa_nodes": 2,
                                                 "memory_node": {"1": 3}}))
    assert sorted((c.host_node, c.memory_host_node) for c in one.cells) == [(0, 0), (1, 3)]


def test_hugepages_come_from_the_named_nodes_pool():
    host = two_sockets_with_cxl()
    placement = allocate(host, spec(memory_node=3, mem_page_size="2MB"))
    assert placement.hugepage_kib == 2048 and placement.memory_nodes == {3}
    assert HostUsage.build(host, [placement]).huge_free_pages(3, 2048) == 4096 - 2048
    with pytest.raises(NoFit) as info:
        allocate(host, spec(memory_node=2, mem_page_size="2MB"))
    assert [(r.constraint, r.where) for r in info.value.reasons] == [("hugepages", "memory_node 2 (cell 0)")]


def test_an_anti_affine_peers_memory_node_is_refused():
    host = two_sockets_with_cxl()
    peer = allocate(host, GuestSpec.from_mapping({"name": "p", "vcpus": 2, "memory_mib": 4096, "memory_node": 2}))
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 2, "memory_mib": 4096, "memory_node": 2,
                                    "anti_affinity": ["p"]})
    with pytest.raises(NoFit) as info:
        allocate(host, guest, [peer])
    assert ("anti-affinity", "memory_node 2") in {(r.constraint, r.where) for r in info.value.reasons}


def test_place_on_nodes_checks_the_named_node_too(gpu_host):
    assert place_on_nodes(gpu_host, spec(memory_node=1), [0]).memory_nodes == {1}
    with pytest.raises(NoFit) as info:
        place_on_nodes(gpu_host, spec(memory_node=0), [0])
    assert {r.constraint for r in info.value.reasons} == {"memory-node"}


# ----- domain XML ----------------------------------------------------------------------------------

def test_the_domain_binds_each_cell_to_its_memory_node_and_reads_back():
    host = two_sockets_with_cxl()
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 4, "memory_mib": 8192, "numa_nodes": 2,
                                    "memory_node": {"1": 3}, "cpu_policy": "dedicated"})
    placement = allocate(host, guest)
    xml = render_domain(guest, placement, domain_type="qemu")  # validated against libvirt's schema
    assert '<memory mode="strict" nodeset="0,3"/>' in xml
    assert '<memnode cellid="0" mode="strict" nodeset="0"/>' in xml
    assert '<memnode cellid="1" mode="strict" nodeset="3"/>' in xml
    back = parse_placement(xml, "cxl", host)
    assert back.cells == placement.cells and back.memory_nodes == placement.memory_nodes
    # Without the topology a memory-only node cannot be told apart: memory is accounted the same.
    blind = parse_placement(xml, "cxl")
    assert memory_by_node(host, blind) == memory_by_node(host, placement)


def test_preferred_mode_names_cell_zeros_memory_node():
    host = two_sockets_with_cxl()
    guest = GuestSpec.from_mapping({"name": "g", "vcpus": 4, "memory_mib": 8192, "numa_nodes": 2,
                                    "memory_node": {"0": 3, "1": 2}, "mem_mode": "preferred"})
    xml = render_domain(guest, allocate(host, guest), domain_type="qemu")
    assert '<memory mode="preferred" nodeset="3"/>' in xml
    assert '<memnode cellid="0" mode="preferred" nodeset="3"/>' in xml
