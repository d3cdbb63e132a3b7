"""The placement engine on named topologies: policies, NUMA cells, memory, NoFit reasons."""

from __future__ import annotations


import pytest

from tests.unit.allocation_fixtures import (
    TOPOLOGIES,
    check_invariants,
    dual_socket_smt,
    hybrid_sparse,
    quad_node_no_smt,
    single_socket_smt,
    sixteen_nodes,
)
from vmplacer.core.placement.allocate import AllocationOptions, NoFit, allocate, place_on_nodes, refresh_shared_pins
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.occupancy import exclusive_of, split_vcpus
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology


def guest(name="g", vcpus=2, memory_mib=1024, **fields) -> GuestSpec:
    return GuestSpec.from_mapping({"name": name, "vcpus": vcpus, "memory_mib": memory_mib, **fields})


def place_all(topology: HostTopology, specs: list[GuestSpec], **kwargs) -> list[Placement]:
    placed: list[Placement] = []
    for spec in specs:
        placed.append(allocate(topology, spec, placed, **kwargs))
    check_invariants(topology, placed, {s.name: s for s in specs}, kwargs.get("options"))
    return placed


def constraints(failure: NoFit) -> set[str]:
    return {r.constraint for r in failure.reasons}


def dedicated_cpus(p: Placement) -> list[int]:
    return [cpu for _, cpu in sorted(split_vcpus(p)[0].items())]


# ----- policies, table-driven over the named topologies ---------------------------------------------
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_dedicated_guest_owns_its_pcpus_on_every_topology(name):
    topology = TOPOLOGIES[name]()
    first = allocate(topology, guest("a", 2, cpu_policy="dedicated"))
    second = allocate(topology, guest("b", 2, cpu_policy="dedicated"), [first])
    assert first.dedicated and second.dedicated
    assert len(first.pcpus) == 2 and not first.pcpus & second.pcpus
    assert first.exclusive_cpus >= first.pcpus
    assert not topology.reserved & (first.pcpus | second.pcpus)


@pytest.mark.parametrize("name", ["single-smt", "dual-smt", "numa16", "hybrid-sparse"])
def test_isolate_leaves_siblings_idle(name):
    topology = TOPOLOGIES[name]()
    lc = allocate(topology, guest("lc", 2, cpu_policy="dedicated", thread_policy="isolate"))
    for cpu in lc.pcpus:
        siblings = {s for s in topology.siblings(cpu) if topology.cpus[s].online}
        assert siblings <= lc.exclusive_cpus
        assert len({topology.cpus[c].core for c in lc.pcpus}) == 2  # one vCPU per core
    # Fill the host with pinned and floating guests: nobody lands on the idle siblings.
    placed = [lc]
    specs = {"lc": guest("lc", 2, cpu_policy="dedicated", thread_policy="isolate")}
    for index in range(40):
        spec = guest(f"f{index}", 1, cpu_policy="dedicated" if index % 2 else "shared")
        try:
            placed.append(allocate(topology, spec, placed))
            specs[spec.name] = spec
        except NoFit:
            break
    check_invariants(topology, placed, specs)
    others = set().union(*(p.pcpus for p in refresh_shared_pins(topology, placed)[1:]))
    assert not others & lc.exclusive_cpus


def test_latency_critical_gets_whole_cores_even_with_shared_policy():
    topology = dual_socket_smt()
    busy = allocate(topology, guest("busy", 3, cpu_policy="dedicated"))
    lc = allocate(topology, guest("lc", 2, workload_class="latency-critical"), [busy])
    assert lc.dedicated and all(len(p) == 1 for p in lc.vcpupin.values())
    for cpu in lc.pcpus:
        assert topology.siblings(cpu) <= lc.exclusive_cpus
        assert not topology.siblings(cpu) & busy.pcpus


@pytest.mark.parametrize("name", ["single-smt", "dual-smt", "numa16"])
def test_require_packs_vcpus_on_sibling_pairs(name):
    topology = TOPOLOGIES[name]()
    p = allocate(topology, guest("r", 4, cpu_policy="dedicated", thread_policy="require"))
    cpus = dedicated_cpus(p)
    assert topology.cpus[cpus[0]].core == topology.cpus[cpus[1]].core
    assert topology.cpus[cpus[2]].core == topology.cpus[cpus[3]].core
    assert p.threads_per_core == 2


def test_require_without_smt_names_the_constraint():
    with pytest.raises(NoFit) as caught:
        allocate(quad_node_no_smt(), guest("r", 2, cpu_policy="dedicated", thread_policy="require"))
    assert constraints(caught.value) == {"smt"}
    assert len(caught.value.reasons) == 4  # one per node, each named
    assert {r.where for r in caught.value.reasons} == {f"cell 0 on node {n}" for n in range(4)}


def test_prefer_uses_whole_cores_for_pairs_on_an_empty_host():
    topology = single_socket_smt()
    p = allocate(topology, guest("p", 4, cpu_policy="dedicated"))
    cpus = dedicated_cpus(p)
    assert len({topology.cpus[c].core for c in cpus}) == 2
    assert p.threads_per_core == 2


def test_prefer_fills_half_used_cores_before_breaking_whole_ones():
    topology = single_socket_smt()
    first = allocate(topology, guest("a", 3, cpu_policy="dedicated"))  # leaves one half-used core
    second = allocate(topology, guest("b", 1, cpu_policy="dedicated"), [first])
    (cpu,) = second.pcpus
    assert topology.siblings(cpu) - {cpu} <= first.pcpus  # took the hole next to guest a


def test_shared_guest_floats_over_the_pool_and_the_pool_shrinks():
    topology = single_socket_smt()
    shared = allocate(topology, guest("s", 2))
    assert not shared.dedicated and not shared.exclusive_cpus
    assert shared.vcpupin[0] == shared.vcpupin[1] == topology.usable_cpus
    pinned = allocate(topology, guest("d", 4, cpu_policy="dedicated", thread_policy="isolate"), [shared])
    refreshed = refresh_shared_pins(topology, [shared, pinned])
    assert refreshed[0].vcpupin[0] == topology.usable_cpus - pinned.exclusive_cpus
    assert refreshed[0].emulatorpin == topology.usable_cpus - pinned.exclusive_cpus
    assert refreshed[1] is pinned


def test_shared_pool_overcommit_limit_is_a_named_constraint():
    topology = single_socket_smt()  # 16 pCPUs
    options = AllocationOptions(cpu_allocation_ratio=1.0)
    placed = place_all(topology, [guest(f"s{i}", 4) for i in range(4)], options=options)
    with pytest.raises(NoFit) as caught:
        allocate(topology, guest("one-more", 1), placed, options=options)
    assert constraints(caught.value) == {"shared-pool"}
    # Nor may a pinned guest take pCPUs the floating guests need.
    with pytest.raises(NoFit) as caught:
        allocate(topology, guest("pinned", 1, cpu_policy="dedicated"), placed, options=options)
    assert "shared-pool" in constraints(caught.value)


def test_mixed_guest_pins_some_vcpus_and_floats_the_rest():
    topology = dual_socket_smt()
    p = allocate(topology, guest("m", 4, cpu_policy="mixed", dedicated_vcpus="1-3"))
    dedicated, shared = split_vcpus(p)
    assert set(dedicated) == {1, 2, 3} and set(shared) == {0}
    assert not shared[0] & exclusive_of(p)
    assert not p.dedicated
    node = topology.cpus[dedicated[1]].node
    assert all(topology.cpus[c].node == node for c in shared[0])
    assert p.emulatorpin == shared[0]  # mixed: emulator threads float with the shared vCPUs


def test_emulator_isolate_takes_one_more_pcpu_on_the_same_node():
    topology = dual_socket_smt()
    p = allocate(topology, guest("e", 2, cpu_policy="dedicated", emulator_threads="isolate"))
    assert len(p.emulatorpin) == 1 and not p.emulatorpin & p.pcpus
    assert p.emulatorpin <= p.exclusive_cpus
    (emu,) = p.emulatorpin
    assert topology.cpus[emu].node == topology.cpus[min(p.pcpus)].node


def test_emulator_share_defaults_and_configured_emulator_cpus():
    topology = hybrid_sparse()
    dedicated = allocate(topology, guest("d", 2, cpu_policy="dedicated"))
    assert dedicated.emulatorpin == dedicated.pcpus
    options = AllocationOptions(emulator_cpus=frozenset({0, 1}))  # the host's reserved CPUs
    routed = allocate(topology, guest("r", 2, cpu_policy="dedicated"), options=options)
    assert routed.emulatorpin == frozenset({0, 1}) and not routed.pcpus & {0, 1}


def test_reserved_offline_and_isolated_cpus():
    topology = hybrid_sparse()
    specs = [guest("s", 2)] + [guest(f"d{i}", 1, cpu_policy="dedicated") for i in range(20)]
    placed = []
    for spec in specs:
        try:
            placed.append(allocate(topology, spec, placed))
        except NoFit:
            pass
    used = set().union(*(p.pcpus for p in placed))
    assert not used & {0, 1}  # reserved
    assert not used & {15, 19}  # offline
    floating = [p for p in placed if not p.dedicated]
    assert floating and not floating[0].pcpus & topology.isolated
    assert {16, 17} & set().union(*(p.pcpus for p in placed if p.dedicated))  # isolcpus serve pinned vCPUs


def test_hybrid_latency_critical_prefers_performance_cores_batch_efficiency():
    topology = hybrid_sparse().with_reserved(frozenset({0, 1, *range(12, 20)}))  # node 0 only
    lc = allocate(topology, guest("lc", 2, memory_mib=512, workload_class="latency-critical"))
    assert {topology.cpus[c].kind for c in lc.pcpus} == {"performance"}
    batch = allocate(topology, guest("b", 2, memory_mib=512, cpu_policy="dedicated", workload_class="batch"), [lc])
    assert {topology.cpus[c].kind for c in batch.pcpus} == {"efficiency"}


def test_memory_only_node_never_hosts_a_cell():
    topology = hybrid_sparse()
    p = allocate(topology, guest("m", 2, numa_nodes=2, cpu_policy="dedicated"))
    assert {c.host_node for c in p.cells} == {0, 1}


# ----- locality and NUMA cells ---------------------------------------------------------------------
def test_small_guest_stays_on_one_node_rather_than_split():
    topology = dual_socket_smt()  # 16 pCPUs per node
    fillers = [guest("f0", 10, cpu_policy="dedicated"), guest("f1", 10, cpu_policy="dedicated")]
    placed = place_all(topology, fillers)
    assert {next(iter(p.memory_nodes)) for p in placed} == {0, 1}
    with pytest.raises(NoFit) as caught:  # 8 pCPUs free, but 6 + 6 across nodes: not split
        allocate(topology, guest("g", 8, cpu_policy="dedicated"), placed)
    assert {r.where for r in caught.value.reasons} == {"cell 0 on node 0", "cell 0 on node 1"}
    assert constraints(caught.value) == {"dedicated-cpus"}


def test_guest_too_big_for_one_node_gets_one_cell_per_node():
    topology = dual_socket_smt()
    p = allocate(topology, guest("big", 24, cpu_policy="dedicated"))
    assert len(p.cells) == 2 and p.memory_nodes == {0, 1}
    assert sorted(len(c.vcpus) for c in p.cells) == [12, 12]


def test_two_cell_guest_picks_close_nodes():
    topology = quad_node_no_smt()  # 0-1 and 2-3 are close (16), across is 22
    p = allocate(topology, guest("two", 4, memory_mib=2048, cpu_policy="dedicated", numa_nodes=2))
    assert p.memory_nodes in ({0, 1}, {2, 3})


def test_explicit_asymmetric_cells():
    topology = quad_node_no_smt()
    spec = guest("asym", 6, memory_mib=3072, cpu_policy="dedicated",
                 numa_cpus={"0": "0-3", "1": "4-5"}, numa_mem={"0": 2048, "1": 1024})
    p = allocate(topology, spec)
    cells = {c.id: c for c in p.cells}
    assert cells[0].vcpus == {0, 1, 2, 3} and cells[0].memory_kib == 2048 * 1024
    assert cells[1].vcpus == {4, 5} and cells[0].host_node != cells[1].host_node


def test_more_cells_than_nodes_is_a_named_constraint():
    with pytest.raises(NoFit) as caught:
        allocate(dual_socket_smt(), guest("wide", 4, numa_nodes=3))
    assert constraints(caught.value) == {"numa-cells"}


def test_eight_cell_guest_on_sixteen_nodes_stays_in_two_packages():
    # Its speed (the case that took Nova minutes) is measured by benchmarks/placement.py.
    topology = sixteen_nodes()
    spec = guest("wide", 64, memory_mib=65536, cpu_policy="dedicated", numa_nodes=8)
    p = allocate(topology, spec)
    assert len(p.cells) == 8 and len(p.memory_nodes) == 8
    assert len({n // 4 for n in p.memory_nodes}) == 2  # two whole packages: the least distance


# ----- memory and hugepages --------------------------------------------------------------------------
def test_guest_bigger_than_the_host_names_the_shortfall():
    with pytest.raises(NoFit) as caught:
        allocate(dual_socket_smt(), guest("x", 8, memory_mib=200_000))
    assert {"numa-cells", "memory"} <= constraints(caught.value)
    assert {r.where for r in caught.value.reasons if r.constraint == "memory"} == {
        "cell 0 on node 0", "cell 0 on node 1"}  # tried as 2 cells: each half still too big


def test_memory_limit_names_node_and_amounts():
    topology = single_socket_smt()  # 32 GiB, of which 2 GiB are 2 MiB pages
    with pytest.raises(NoFit) as caught:
        allocate(topology, guest("huge", 2, memory_mib=31 * 1024))
    (reason,) = [r for r in caught.value.reasons if r.constraint != "numa-cells"]
    assert (reason.constraint, reason.where) == ("memory", "cell 0 on node 0")
    assert reason.need == "31744 MiB" and reason.have == "30720 MiB free"


def test_hugepages_are_accounted_per_pool():
    topology = dual_socket_smt()  # 8 x 1 GiB pages on node 0 only
    first = allocate(topology, guest("h1", 2, memory_mib=6144, mem_page_size="1GB"))
    assert first.hugepage_kib == 1048576 and first.memory_nodes == {0}
    with pytest.raises(NoFit) as caught:
        allocate(topology, guest("h2", 2, memory_mib=4096, mem_page_size="1GB"), [first])
    reasons = {(r.constraint, r.where): r for r in caught.value.reasons}
    assert reasons[("hugepages", "cell 0 on node 0")].have == "2"
    assert reasons[("hugepages", "cell 0 on node 1")].have == "0"


def test_page_size_must_divide_memory():
    with pytest.raises(NoFit) as caught:
        allocate(dual_socket_smt(), guest("odd", 2, memory_mib=1536, mem_page_size="1GB"))
    assert "page-size" in constraints(caught.value)


def test_large_picks_the_largest_page_that_fits_and_any_falls_back_to_small():
    topology = dual_socket_smt()
    large = allocate(topology, guest("l", 2, memory_mib=2048, mem_page_size="large"))
    assert large.hugepage_kib == 1048576
    odd = allocate(topology, guest("l2", 2, memory_mib=1026, mem_page_size="large"), [large])
    assert odd.hugepage_kib == 2048
    quad = quad_node_no_smt()  # no hugepage pools at all
    assert allocate(quad, guest("a", 1, mem_page_size="any")).hugepage_kib is None
    with pytest.raises(NoFit) as caught:
        allocate(quad, guest("b", 1, mem_page_size="large"))
    assert constraints(caught.value) == {"hugepages"}


# ----- affinity, names, scoring -------------------------------------------------------------------------
def test_anti_affinity_keeps_guests_on_different_nodes_from_either_side():
    topology = dual_socket_smt()
    db1 = allocate(topology, guest("db1", 2, cpu_policy="dedicated"))
    db2 = allocate(topology, guest("db2", 2, cpu_policy="dedicated", anti_affinity=["db1"]), [db1])
    assert not db1.memory_nodes & db2.memory_nodes
    db3 = guest("db3", 2, cpu_policy="dedicated")
    with pytest.raises(NoFit) as caught:  # db1 and db2 both refuse db3: no node is left
        allocate(topology, db3, [db1, db2], anti_affinity_of_others={"db1": ["db3"], "db2": ["db3"]})
    assert constraints(caught.value) == {"anti-affinity"}


def test_affinity_prefers_the_peers_node():
    topology = dual_socket_smt()
    web = allocate(topology, guest("web", 2, cpu_policy="dedicated"))
    other = allocate(topology, guest("x", 2, cpu_policy="dedicated"), [web])
    cache = allocate(topology, guest("cache", 2, cpu_policy="dedicated", affinity=["x"]), [web, other])
    assert cache.memory_nodes == other.memory_nodes


def test_a_name_already_placed_is_refused():
    topology = single_socket_smt()
    first = allocate(topology, guest("dup", 1))
    with pytest.raises(NoFit) as caught:
        allocate(topology, guest("dup", 1), [first])
    assert constraints(caught.value) == {"name"}


def test_scorer_is_pluggable():
    class HighestNode:
        def score(self, topology, placement, others):
            return max(placement.memory_nodes) / 10

    p = allocate(quad_node_no_smt(), guest("s", 2), scorer=HighestNode())
    assert p.memory_nodes == {3} and p.score == pytest.approx(0.3)


def test_nofit_message_lists_every_reason():
    with pytest.raises(NoFit) as caught:
        allocate(dual_socket_smt(), guest("x", 12, memory_mib=200_000, cpu_policy="dedicated",
                                          thread_policy="isolate", numa_nodes=1))
    text = str(caught.value)
    assert text.startswith("guest x does not fit on host dual-smt:")
    assert "cell 0 on node 0: whole-cores: need 12 free whole cores (thread_policy isolate), have 8" in text
    assert "cell 0 on node 1: memory: need" in text
    assert caught.value.to_dict()["reasons"][0]["constraint"]


def test_place_on_nodes_builds_a_what_if_and_allocate_scores_at_least_as_well():
    topology = quad_node_no_smt()
    spec = guest("two", 4, cpu_policy="dedicated", numa_nodes=2)
    far = place_on_nodes(topology, spec, [0, 2])
    best = allocate(topology, spec)
    assert far.memory_nodes == {0, 2} and best.score > far.score
    assert place_on_nodes(topology, spec, sorted(best.memory_nodes)).score == best.score
    with pytest.raises(NoFit):
        place_on_nodes(topology, spec, [1, 1])
