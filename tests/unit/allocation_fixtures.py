"""Named host topologies and invariant checks shared by the allocator tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from vmplacer.core.placement.allocate import AllocationOptions, owners_disjoint, refresh_shared_pins
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.occupancy import SMALL_PAGE_KIB, HostUsage, exclusive_of, split_vcpus
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import Cpu, HostTopology, HugepagePool, Node, uniform_topology

GIB_KIB = 1024 * 1024


def single_socket_smt() -> HostTopology:
    """One node, 8 cores x 2 threads (siblings n and n+8), 32 GiB, 2 MiB pages."""
    topo = uniform_topology(nodes=1, cores_per_node=8, threads_per_core=2, memory_mib_per_node=32768,
                            name="single-smt")
    node = replace(topo.nodes[0], hugepages=(HugepagePool(2048, 1024, 1024),))
    return replace(topo, nodes={0: node})


def dual_socket_smt() -> HostTopology:
    """Two nodes x 8 cores x 2 threads, 64 GiB per node, 1 GiB pages on node 0 only."""
    topo = uniform_topology(nodes=2, cores_per_node=8, threads_per_core=2, memory_mib_per_node=65536,
                            name="dual-smt")
    nodes = dict(topo.nodes)
    nodes[0] = replace(nodes[0], hugepages=(HugepagePool(2048, 2048, 2048), HugepagePool(1048576, 8, 8)))
    nodes[1] = replace(nodes[1], hugepages=(HugepagePool(2048, 2048, 2048),))
    return replace(topo, nodes=nodes)


def quad_node_no_smt() -> HostTopology:
    """Opteron-like: 4 nodes x 8 cores, no SMT; nodes 0-1 and 2-3 share a package (distance 16 vs 22)."""
    topo = uniform_topology(nodes=4, cores_per_node=8, threads_per_core=1, memory_mib_per_node=32768,
                            name="quad-nosmt")
    pair = {0: 0, 1: 0, 2: 1, 3: 1}
    nodes = {
        n: replace(node, distances={m: 10 if m == n else (16 if pair[m] == pair[n] else 22) for m in range(4)})
        for n, node in topo.nodes.items()
    }
    return replace(topo, nodes=nodes)


def sixteen_nodes() -> HostTopology:
    """16 nodes x 16 cores x 2 threads = 512 pCPUs; 4 packages of 4 nodes (12 inside, 32 across)."""
    topo = uniform_topology(nodes=16, cores_per_node=16, threads_per_core=2, memory_mib_per_node=65536,
                            name="numa16")
    nodes = {
        n: replace(node, distances={m: 10 if m == n else (12 if m // 4 == n // 4 else 32) for m in range(16)})
        for n, node in topo.nodes.items()
    }
    return replace(topo, nodes=nodes)


def hybrid_sparse() -> HostTopology:
    """Hybrid and irregular: P-cores (2 threads, adjacent numbering) and E-cores (1 thread) on
    node 0, offline threads on node 1, a memory-only node 2, reserved and isolated CPUs."""
    cpus: dict[int, Cpu] = {}
    core = 0
    for first in (0, 2, 4, 6):  # node 0 P-cores: (0,1) (2,3) (4,5) (6,7)
        for cpu in (first, first + 1):
            cpus[cpu] = Cpu(cpu, node=0, package=0, core=core, l2=core, llc=0, kind="performance")
        core += 1
    for cpu in (8, 9, 10, 11):  # node 0 E-cores, one thread each, pairs share an L2
        cpus[cpu] = Cpu(cpu, node=0, package=0, core=core, l2=100 + (cpu - 8) // 2, llc=0, kind="efficiency")
        core += 1
    for first in (12, 14, 16, 18):  # node 1: (12,13) (14,15) (16,17) (18,19); 19 and 15 offline
        for cpu in (first, first + 1):
            cpus[cpu] = Cpu(cpu, node=1, package=1, core=core, l2=core, llc=1, online=cpu not in (15, 19))
        core += 1
    nodes = {
        0: Node(0, 16 * GIB_KIB, 16 * GIB_KIB, {0: 10, 1: 21, 2: 17}, (HugepagePool(2048, 512, 512),)),
        1: Node(1, 16 * GIB_KIB, 16 * GIB_KIB, {0: 21, 1: 10, 2: 28}, (HugepagePool(1048576, 2, 2),)),
        2: Node(2, 8 * GIB_KIB, 8 * GIB_KIB, {0: 17, 1: 28, 2: 10}),
    }
    return HostTopology(nodes=nodes, cpus=cpus, reserved=frozenset({0, 1}), isolated=frozenset({16, 17}),
                        name="hybrid-sparse")


TOPOLOGIES = {
    "single-smt": single_socket_smt,
    "dual-smt": dual_socket_smt,
    "quad-nosmt": quad_node_no_smt,
    "numa16": sixteen_nodes,
    "hybrid-sparse": hybrid_sparse,
}


def check_invariants(topology: HostTopology, placements: Sequence[Placement],
                     specs: dict[str, GuestSpec], options: AllocationOptions | None = None) -> None:
    """Everything that must hold for any set of placements the allocator produced."""
    options = options or AllocationOptions()
    for p in placements:  # as allocated, before floating pins are refreshed
        _, shared = split_vcpus(p)
        for pins in shared.values():
            assert not pins & exclusive_of(p), f"{p.guest} floats over its own pinned pCPUs"
    placements = refresh_shared_pins(topology, placements)
    assert owners_disjoint(placements) == []
    usage = HostUsage.build(topology, placements)
    usable = topology.usable_cpus
    for p in placements:
        guest = specs[p.guest]
        dedicated, shared = split_vcpus(p)
        assert set(dedicated) == set(guest.dedicated_vcpu_set), p.guest
        assert sorted(p.vcpupin) == list(range(guest.vcpus))
        for pins in p.vcpupin.values():
            assert pins and pins <= usable, f"{p.guest} uses unusable pCPUs {sorted(pins - usable)}"
        for pins in shared.values():
            assert not pins & topology.isolated, f"{p.guest} floats over isolcpus"
        assert p.emulatorpin and p.emulatorpin <= usable | options.emulator_cpus
        assert len(set(dedicated.values())) == len(dedicated), f"{p.guest} shares a pCPU between its vCPUs"
        # Cells: distinct host nodes with CPUs, vCPUs pinned inside their cell's node.
        assert len({c.host_node for c in p.cells}) == len(p.cells)
        assert p.memory_nodes == frozenset(c.host_node for c in p.cells)
        assert sum(c.memory_kib for c in p.cells) == guest.memory_mib * 1024
        for cell in p.cells:
            for vcpu in cell.vcpus:
                assert all(topology.cpus[c].node == cell.host_node for c in p.vcpupin[vcpu])
        policy = guest.effective_thread_policy
        if policy == "isolate" and dedicated:
            for cpu in dedicated.values():
                online = {s for s in topology.siblings(cpu) if topology.cpus[s].online}
                assert online <= exclusive_of(p), f"{p.guest}: siblings of {cpu} not kept idle"
                others = set().union(*(q.pcpus | q.emulatorpin for q in placements if q is not p))
                assert not (online - {cpu}) & others, f"{p.guest}: a co-runner on a sibling of {cpu}"
        if policy == "require" and dedicated:
            for cell in p.cells:
                ordered = [v for v in sorted(cell.vcpus) if v in dedicated]
                for start in range(0, len(ordered) - 1, 2):
                    a, b = dedicated[ordered[start]], dedicated[ordered[start + 1]]
                    assert topology.cpus[a].core == topology.cpus[b].core, f"{p.guest}: {a},{b} not siblings"
        if p.hugepage_kib:
            assert all(c.memory_kib % p.hugepage_kib == 0 for c in p.cells)
    # Memory and hugepages never exceed what the nodes have.
    for node_id, node in topology.nodes.items():
        huge = sum(pool.size_kib * pool.total for pool in node.hugepages if pool.size_kib > SMALL_PAGE_KIB)
        assert usage.small_used_kib.get(node_id, 0) <= node.memory_kib - huge
        for pool in node.hugepages:
            assert usage.huge_used.get((node_id, pool.size_kib), 0) <= pool.total
        load = usage.shared_load.get(node_id, 0.0)
        if load:
            pool = usage.shared_pool(node_id)
            assert pool and load <= len(pool) * options.cpu_allocation_ratio + 1e-9

