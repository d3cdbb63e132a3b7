"""Table-driven queries on named topologies, read by the real readers.

Named hosts: the recorded sysfs trees (tests/data/make_sysfs_fixtures.py) and
the example capabilities files (examples/hosts/). Expectations come from how
each machine is built (its datasheet), written out per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit import sysfs_fixtures
from vmplacer.adapters.capabilities import read_capabilities_file
from vmplacer.adapters.sysfs import read_sysfs
from vmplacer.core.topology.assemble import CacheFacts, CpuFacts, TopologyError, assemble_topology
from vmplacer.core.topology.host import DistanceClass, HostTopology, Node

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "hosts"


fixtures = sysfs_fixtures.load()
SYSFS_NAMES = sorted(fixtures.machines())
EXAMPLE_NAMES = sorted(path.stem for path in EXAMPLES.glob("*.xml"))


@pytest.fixture(scope="module")
def roots(sysfs_roots) -> dict[str, Path]:
    return sysfs_roots


@pytest.fixture(scope="module")
def named(roots):
    cache: dict[str, HostTopology] = {}

    def get(name: str) -> HostTopology:
        if name not in cache:
            if name in roots:
                cache[name] = read_sysfs(roots[name], name=name)
            else:
                cache[name] = read_capabilities_file(EXAMPLES / f"{name}.xml")
        return cache[name]

    return get


SIBLINGS = [
    ("xeon-2s-sparse", 3, {3, 35}),
    ("xeon-2s-sparse", 38, {6, 38}),
    ("xeon-2s-sparse", 11, {11}),  # CPU 43 offline
    ("power9-smt4", 5, {4, 5, 6, 7}),
    ("power9-smt4", 33, {32, 33, 34, 35}),
    ("hybrid-adl", 2, {2, 3}),
    ("hybrid-adl", 17, {17}),
    ("memory-only-node", 9, {1, 9}),
    ("amd-nps2", 20, {20, 52}),
    ("xeon-2s-56c-smt2", 0, {0, 56}),
    ("xeon-2s-56c-smt2", 84, {28, 84}),
    ("opteron6378-4node", 9, {9}),
    ("xeon-e3-4c8t", 3, {3, 7}),
    ("numa16-256c", 300, {44, 300}),
]


@pytest.mark.parametrize(("host", "cpu", "expected"), SIBLINGS)
def test_siblings(named, host, cpu, expected):
    assert named(host).siblings(cpu) == expected


DISTANCES = [
    ("xeon-2s-sparse", 4, 4, DistanceClass.SAME_CPU),
    ("xeon-2s-sparse", 0, 32, DistanceClass.SAME_CORE),
    ("xeon-2s-sparse", 0, 1, DistanceClass.SAME_LLC),
    ("xeon-2s-sparse", 0, 6, DistanceClass.REMOTE_NODE),
    ("xeon-2s-sparse", 0, 43, DistanceClass.REMOTE_NODE),  # offline, node from its link
    ("power9-smt4", 0, 3, DistanceClass.SAME_CORE),
    ("power9-smt4", 0, 4, DistanceClass.SAME_L2),  # core pair
    ("power9-smt4", 0, 8, DistanceClass.SAME_NODE),
    ("power9-smt4", 0, 32, DistanceClass.REMOTE_NODE),
    ("hybrid-adl", 0, 1, DistanceClass.SAME_CORE),
    ("hybrid-adl", 16, 19, DistanceClass.SAME_L2),  # E-core cluster
    ("hybrid-adl", 0, 16, DistanceClass.SAME_LLC),
    ("memory-only-node", 0, 7, DistanceClass.SAME_LLC),
    ("amd-nps2", 0, 3, DistanceClass.SAME_LLC),  # one CCX
    ("amd-nps2", 0, 4, DistanceClass.SAME_NODE),  # next CCX, same NPS2 node
    ("amd-nps2", 0, 8, DistanceClass.REMOTE_NODE),  # other node, same socket
    ("amd-nps2", 0, 16, DistanceClass.REMOTE_NODE),
    ("opteron6378-4node", 2, 3, DistanceClass.SAME_L2),
    ("opteron6378-4node", 0, 7, DistanceClass.SAME_LLC),
    ("opteron6378-4node", 7, 8, DistanceClass.REMOTE_NODE),
    ("xeon-e3-4c8t", 1, 5, DistanceClass.SAME_CORE),
    ("xeon-e3-4c8t", 1, 2, DistanceClass.SAME_LLC),
    ("numa16-256c", 0, 15, DistanceClass.SAME_LLC),
    ("numa16-256c", 0, 16, DistanceClass.REMOTE_NODE),
    ("numa16-256c", 0, 511, DistanceClass.REMOTE_NODE),
]


@pytest.mark.parametrize(("host", "a", "b", "expected"), DISTANCES)
def test_distance_class(named, host, a, b, expected):
    topology = named(host)
    assert topology.distance_class(a, b) == expected
    assert topology.distance_class(b, a) == expected


def test_the_table_covers_every_distance_class():
    assert {row[3] for row in DISTANCES} == set(DistanceClass)


NODE_DISTANCES = [
    ("amd-nps2", 0, 1, 11),
    ("amd-nps2", 1, 2, 32),
    ("power9-smt4", 0, 8, 40),
    ("numa16-256c", 4, 5, 12),
    ("numa16-256c", 4, 6, 32),
    ("memory-only-node", 1, 0, 20),
    ("opteron6378-4node", 3, 0, 16),
]


@pytest.mark.parametrize(("host", "a", "b", "expected"), NODE_DISTANCES)
def test_node_distance(named, host, a, b, expected):
    assert named(host).distance(a, b) == expected


# Online cores per node; xeon-2s-sparse node 1 also holds the core of offline CPU 43.
CORES_PER_NODE = [
    ("xeon-2s-sparse", {0: 6, 1: 6}, {0: 6, 1: 7}),
    ("power9-smt4", {0: 8, 8: 8}, None),
    ("hybrid-adl", {0: 12}, None),
    ("memory-only-node", {0: 8, 1: 0}, None),
    ("amd-nps2", {0: 8, 1: 8, 2: 8, 3: 8}, None),
    ("xeon-2s-56c-smt2", {0: 28, 1: 28}, None),
    ("opteron6378-4node", {n: 8 for n in range(4)}, None),
    ("xeon-e3-4c8t", {0: 4}, None),
    ("numa16-256c", {n: 16 for n in range(16)}, None),
]


@pytest.mark.parametrize(("host", "online", "listed"), CORES_PER_NODE)
def test_cores_per_node(named, host, online, listed):
    topology = named(host)
    counted = {
        node: sum(1 for core in topology.cores_in_node(node) if set(core.cpus) & topology.online_cpus)
        for node in topology.nodes
    }
    assert counted == online
    assert {node: len(topology.cores_in_node(node)) for node in topology.nodes} == (listed or online)


SMT_AND_LLC = [
    # host, threads per core, LLC groups, pCPUs in the LLC of CPU 0
    ("xeon-2s-sparse", 2, 2, 12),
    ("power9-smt4", 4, 8, 8),
    ("hybrid-adl", 2, 1, 20),
    ("memory-only-node", 2, 1, 16),
    ("amd-nps2", 2, 8, 8),
    ("xeon-2s-56c-smt2", 2, 2, 56),
    ("opteron6378-4node", 1, 4, 8),
    ("xeon-e3-4c8t", 2, 1, 8),
    ("numa16-256c", 2, 16, 32),
]


@pytest.mark.parametrize(("host", "smt", "llc_groups", "llc_size"), SMT_AND_LLC)
def test_smt_and_llc_groups(named, host, smt, llc_groups, llc_size):
    topology = named(host)
    assert topology.smt == smt
    assert len(topology.llc_groups) == llc_groups
    assert len(topology.cpus_in_llc(topology.cpus[0].llc)) == llc_size


FREE_CORES = [
    # host, node, used pCPUs, expected free cores
    ("xeon-2s-sparse", 0, set(), 6),
    ("xeon-2s-sparse", 0, {0}, 5),  # one thread used takes the whole core
    ("xeon-2s-sparse", 1, set(), 6),  # the offline CPU's core is never free
    ("power9-smt4", 8, {32, 37}, 6),
    ("hybrid-adl", 0, {16}, 11),
    ("memory-only-node", 1, set(), 0),
    ("amd-nps2", None, set(range(8)), 24),
    ("numa16-256c", 15, {240, 496}, 15),
]


@pytest.mark.parametrize(("host", "node", "used", "expected"), FREE_CORES)
def test_free_cores(named, host, node, used, expected):
    cores = named(host).free_cores(node, used)
    assert len(cores) == expected
    assert all(not set(core.cpus) & used for core in cores)


def test_reserved_cpus_leave_the_free_cores(named):
    topology = named("xeon-e3-4c8t").with_reserved({0, 4})
    assert [core.cpus for core in topology.free_cores(0, set())] == [(1, 5), (2, 6), (3, 7)]


# ----- invariants on every named host ----------------------------------------------------

@pytest.mark.parametrize("host", SYSFS_NAMES + EXAMPLE_NAMES)
def test_invariants(named, host):
    topology = named(host)
    online = topology.online_cpus
    seen: set[int] = set()
    for core in topology.cores:
        assert not seen & set(core.cpus), "a CPU in two cores"
        seen |= set(core.cpus)
        assert {topology.cpus[c].node for c in core.cpus} == {core.node}
        for cpu in core.cpus:
            assert topology.siblings(cpu) == set(core.cpus)
    assert seen == set(topology.cpus)
    assert sorted(core.id for core in topology.cores) == list(range(len(topology.cores)))
    assert set().union(*topology.llc_groups.values()) == online
    assert sum(len(g) for g in topology.llc_groups.values()) == len(online)
    assert set().union(*topology.l2_groups.values()) == online
    assert all(cpu.node in topology.nodes for cpu in topology.cpus.values())
    assert topology.smt == max(len(core.cpus) for core in topology.cores)
    for node in topology.nodes:
        assert topology.distance(node, node) == 10


# ----- assemble_topology directly ----------------------------------------------------------

NODE0 = {0: Node(0, 1024, 1024)}


def test_core_ids_repeating_per_package_are_numbered_globally():
    facts = [CpuFacts(i, 0, package=i // 2, core_id=i % 2) for i in range(4)]
    topology = assemble_topology(facts, NODE0)
    assert [core.cpus for core in topology.cores] == [(0,), (1,), (2,), (3,)]
    assert [core.id for core in topology.cores] == [0, 1, 2, 3]


def test_without_sibling_lists_threads_group_by_package_die_and_core_id():
    facts = [CpuFacts(i, 0, package=0, die=i // 4, core_id=i % 2) for i in range(8)]
    topology = assemble_topology(facts, NODE0)
    assert [core.cpus for core in topology.cores] == [(0, 2), (1, 3), (4, 6), (5, 7)]


@pytest.mark.parametrize(
    ("facts", "nodes", "caches", "message"),
    [
        ([CpuFacts(0, 0, package=0, core_id=0)] * 2, NODE0, [], r"CPU 0 is listed twice"),
        ([CpuFacts(0, 5, package=0, core_id=0)], NODE0, [], r"CPU 0 is in NUMA node 5"),
        ([CpuFacts(0, 0, package=0, core_id=0, siblings=frozenset({0, 1})),
          CpuFacts(1, 0, package=0, core_id=0, siblings=frozenset({1}))], NODE0, [],
         r"CPU 0 reports SMT siblings \[0, 1\], but CPU 1 reports \[1\]"),
        ([CpuFacts(0, 0, package=0, core_id=0, siblings=frozenset({0, 1})),
          CpuFacts(1, 1, package=0, core_id=0, siblings=frozenset({0, 1}))],
         {0: Node(0, 1, 1), 1: Node(1, 1, 1)}, [], r"disagree on node/package/die"),
        ([CpuFacts(i, 0, package=0, core_id=i) for i in range(3)], NODE0,
         [CacheFacts(3, frozenset({0, 1})), CacheFacts(3, frozenset({1, 2}))],
         r"CPU 1 is in two different last-level caches"),
    ],
)
def test_contradictions_are_errors(facts, nodes, caches, message):
    with pytest.raises(TopologyError, match=message):
        assemble_topology(facts, nodes, caches, name="bad")
