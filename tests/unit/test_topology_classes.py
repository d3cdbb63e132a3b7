"""Every kind of host the topology readers must handle, read by both readers.

One sysfs tree per kind (tests/data/make_sysfs_fixtures.py) and capabilities
XML of five of them (tests/data/capabilities/). Expected numbers come from how
each machine is built, written out per row, not derived from the generator.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from tests.support import require
from tests.unit import sysfs_fixtures
from vmplacer.adapters.capabilities import CapabilitiesError, parse_capabilities, read_capabilities_file
from vmplacer.adapters.sysfs import SysfsError, read_sysfs
from vmplacer.core.topology.assemble import CpuFacts, assemble_topology
from vmplacer.core.topology.host import HostTopology, Node

fixtures = sysfs_fixtures.load()
MACHINES = fixtures.machines()
CAPS_DIR = Path(__file__).resolve().parents[1] / "data" / "capabilities"
SCHEMA = Path("/usr/share/libvirt/schemas/capability.rng")


@dataclass(frozen=True)
class Shape:
    nodes: int
    packages: int
    dies: int
    clusters: int
    cores: int  # cores with an online CPU
    pcpus: int
    online: int
    llcs: int
    smt: int
    offline: tuple[int, ...] = ()
    memory_only: tuple[int, ...] = ()


def shape(topology: HostTopology) -> Shape:
    online = topology.online_cpus
    return Shape(
        nodes=len(topology.nodes),
        packages=len(topology.packages),
        dies=len(topology.dies),
        clusters=len(topology.clusters),
        cores=sum(1 for core in topology.cores if set(core.cpus) & online),
        pcpus=len(topology.cpus),
        online=len(online),
        llcs=len(topology.llc_groups),
        smt=topology.smt,
        offline=tuple(sorted(set(topology.cpus) - online)),
        memory_only=topology.memory_only_nodes,
    )


SYSFS_SHAPES = {
    "xeon-2s-sparse": Shape(2, 2, 2, 0, 12, 24, 23, 2, 2, offline=(43,)),
    "power9-smt4": Shape(2, 2, 2, 0, 16, 64, 64, 8, 4),
    "hybrid-adl": Shape(1, 1, 1, 0, 12, 20, 20, 1, 2),
    "memory-only-node": Shape(2, 1, 1, 0, 8, 16, 16, 1, 2, memory_only=(1,)),
    "amd-nps2": Shape(4, 2, 2, 0, 32, 64, 64, 8, 2),
    # trailing NULs in every file
    "xeon-snc-nul": Shape(4, 2, 2, 0, 16, 32, 32, 2, 2),
    # hex masks only (thread_siblings, core_siblings, shared_cpu_map)
    "xeon-2s-masks": Shape(2, 2, 2, 0, 20, 40, 40, 2, 2),
    # no core_id, no physical_package_id: cores from the sibling lists, one package per node
    "kvm-no-ids": Shape(1, 1, 1, 0, 4, 8, 8, 1, 2),
    "empty-cpu0-online": Shape(1, 1, 1, 0, 4, 8, 8, 1, 2),
    # node 0 offline with its CPUs 0-3: still listed, with their own cores
    "cpu0-offline-node0": Shape(2, 1, 1, 0, 4, 12, 8, 1, 2, offline=(0, 1, 2, 3)),
    # physical_package_id -1: 8 sockets from core_siblings_list; only per-CPU caches: LLC per core
    "s390x-books": Shape(1, 8, 8, 0, 16, 32, 32, 16, 2),
    # node cpumap only, no cpuN/nodeM links
    "xeon-2s-cpumap": Shape(2, 2, 2, 0, 20, 40, 40, 2, 2),
    "arm-gpu-memory": Shape(3, 1, 1, 0, 16, 16, 16, 1, 1, memory_only=(1, 2)),
    "epyc-4die-llc": Shape(1, 1, 4, 0, 16, 32, 32, 4, 2),
    "arm-clusters": Shape(2, 1, 1, 8, 32, 32, 32, 2, 1),
    # masks only, and an L3 private to each core: 4 LLCs
    "ia64-montecito": Shape(1, 2, 2, 0, 4, 8, 8, 4, 2),
}

CAPS_SHAPES = {
    "epyc-4die-llc": Shape(1, 1, 4, 0, 16, 32, 32, 4, 2),  # cluster_id='65535': none
    "arm-clusters": Shape(2, 1, 1, 8, 32, 32, 32, 2, 1),
    "arm-gpu-memory": Shape(3, 1, 1, 0, 16, 16, 16, 1, 1, memory_only=(1, 2)),
    # libvirt lists the online nodes only and leaves offline CPUs out on x86
    "cpu0-offline-node0": Shape(1, 1, 1, 0, 4, 8, 8, 1, 2),
    "hybrid-adl": Shape(1, 1, 1, 0, 12, 20, 20, 1, 2),
}

# What libvirt's capabilities cannot carry, by libvirt's own rules (see libvirt_capabilities).
CAPS_CANNOT_DESCRIBE = {
    "xeon-2s-masks": {"cores", "core_ids", "smt"},  # siblings from thread_siblings_list only: each CPU alone
    "s390x-books": {"packages", "dies", "llc"},  # socket_id 0 for package id -1; no shared cache banks
    # masks only, as xeon-2s-masks; no cache banks either, so the per-core L3 becomes one LLC per die
    "ia64-montecito": {"cores", "core_ids", "smt", "llc"},
}


def test_every_machine_has_a_row():
    assert set(SYSFS_SHAPES) == set(MACHINES)
    assert set(CAPS_SHAPES) == set(fixtures.CAPS_FIXTURES)


@pytest.mark.parametrize("name", sorted(SYSFS_SHAPES))
def test_sysfs_reads_each_machine_right(sysfs_roots, name):
    assert shape(read_sysfs(sysfs_roots[name], name=name)) == SYSFS_SHAPES[name]


@pytest.mark.parametrize("name", sorted(CAPS_SHAPES))
def test_capabilities_read_each_fixture_right(name):
    assert shape(read_capabilities_file(CAPS_DIR / f"{name}.xml")) == CAPS_SHAPES[name]


# ----- both readers agree where libvirt can describe the machine ------------------------------

def signature(topology: HostTopology) -> dict:
    """What must not depend on the reader, over online CPUs and the nodes libvirt lists
    (those with online CPUs or memory)."""
    online = topology.online_cpus
    listed = [n for n in topology.nodes if topology.cpus_in_node(n) & online or topology.nodes[n].memory_kib]
    return {
        "nodes": {n: (sorted(topology.cpus_in_node(n) & online), topology.nodes[n].memory_kib,
                      topology.nodes[n].distances, {p.size_kib: p.total for p in topology.nodes[n].hugepages})
                  for n in listed},
        "cores": sorted(sorted(set(c.cpus) & online) for c in topology.cores if set(c.cpus) & online),
        "core_ids": {c: topology.cpus[c].core for c in sorted(online)},
        "packages": {c: topology.cpus[c].package for c in sorted(online)},
        "dies": sorted(sorted(v) for v in topology.dies.values()),
        "clusters": sorted(sorted(v) for v in topology.clusters.values()),
        "llc": sorted(sorted(g) for g in topology.llc_groups.values()),
        "smt": topology.smt,
    }


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_sysfs_and_capabilities_of_one_machine_agree(sysfs_roots, name):
    from_sysfs = signature(read_sysfs(sysfs_roots[name], name=name))
    from_caps = signature(parse_capabilities(fixtures.libvirt_capabilities(MACHINES[name]), name=name))
    differ = {key for key in from_sysfs if from_sysfs[key] != from_caps[key]}
    # Where libvirt cannot describe the machine, it differs in exactly what it loses, nothing more.
    assert differ == CAPS_CANNOT_DESCRIBE.get(name, set())


@pytest.mark.parametrize("name", fixtures.CAPS_FIXTURES)
def test_capabilities_fixture_is_what_the_generator_writes(name):
    committed = (CAPS_DIR / f"{name}.xml").read_text()
    assert committed == fixtures.libvirt_capabilities(MACHINES[name]), \
        "run tests/data/make_sysfs_fixtures.py --caps"


@pytest.mark.parametrize("name", fixtures.CAPS_FIXTURES)
def test_capabilities_fixture_validates_against_libvirts_schema(name):
    require(SCHEMA.exists(), f"{SCHEMA} missing (package libvirt-daemon)")
    schema_text = SCHEMA.read_text()
    document = etree.parse(str(CAPS_DIR / f"{name}.xml"))
    if "cluster_id" not in schema_text:  # libvirt before 10 has no cluster_id: check the rest
        for cpu in document.iter("cpu"):
            cpu.attrib.pop("cluster_id", None)
    schema = etree.RelaxNG(etree.parse(str(SCHEMA)))
    assert schema.validate(document), schema.error_log.last_error


# ----- each class of host, in detail ---------------------------------------------------------

def cpu_files(root: Path) -> Path:
    return root / "sys" / "devices" / "system" / "cpu"


def node_files(root: Path) -> Path:
    return root / "sys" / "devices" / "system" / "node"


def test_trailing_nuls_read_as_if_absent(sysfs_roots, tmp_path):
    root = sysfs_roots["xeon-snc-nul"]
    assert (node_files(root) / "online").read_bytes() == b"0-3\n\x00"
    clean = fixtures.write_machine(replace(MACHINES["xeon-snc-nul"], nul_padding=False), tmp_path)
    assert read_sysfs(root, name="x").to_dict() == read_sysfs(clean, name="x").to_dict()


def test_hex_masks_alone_give_siblings_packages_and_caches(sysfs_roots):
    root = sysfs_roots["xeon-2s-masks"]
    cpu5 = cpu_files(root) / "cpu5"
    assert not list(cpu5.glob("topology/*_list")) and not list(cpu5.glob("cache/*/shared_cpu_list"))
    assert (cpu5 / "topology" / "thread_siblings").read_text() == "0000,02000020\n"  # two 32-bit words
    topology = read_sysfs(root)
    assert topology.siblings(5) == {5, 25}
    assert topology.cpus_in_llc(topology.cpus[5].llc) == set(range(10)) | set(range(20, 30))
    assert topology.warnings == ()


def test_no_core_or_package_ids_warn_and_use_sibling_lists(sysfs_roots):
    root = sysfs_roots["kvm-no-ids"]
    assert not (cpu_files(root) / "cpu0" / "topology" / "core_id").exists()
    topology = read_sysfs(root)
    assert [core.cpus for core in topology.cores] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert topology.packages == (0,)
    core_id, package_id = sorted(topology.warnings)
    assert "cpu0/topology/core_id (and 7 more like it): missing; cores taken from the SMT sibling lists" in core_id
    assert "physical_package_id (and 7 more like it): missing" in package_id
    assert "one package per NUMA node" in package_id


def test_empty_cpu0_online_leaves_cpu0_online(sysfs_roots):
    root = sysfs_roots["empty-cpu0-online"]
    assert (cpu_files(root) / "cpu0" / "online").read_text() == ""
    topology = read_sysfs(root)
    assert 0 in topology.online_cpus
    assert topology.warnings == (f"{cpu_files(root) / 'cpu0' / 'online'}: empty; the online list decides",)


def test_cpu0_offline_with_node0_keeps_the_distance_rows(sysfs_roots):
    root = sysfs_roots["cpu0-offline-node0"]
    assert (node_files(root) / "online").read_text() == "1\n"
    assert (node_files(root) / "node1" / "distance").read_text() == "20 10\n"
    topology = read_sysfs(root)
    assert topology.nodes[1].distances == {0: 20, 1: 10}
    assert topology.cpus_in_node(0) == {0, 1, 2, 3} and not topology.cpus_in_node(0) & topology.online_cpus
    assert topology.nodes[0].memory_kib == 0
    assert topology.memory_only_nodes == ()  # node 0 has CPUs, offline ones


def test_s390x_sockets_come_from_core_siblings_when_the_package_id_is_minus_one(sysfs_roots):
    root = sysfs_roots["s390x-books"]
    assert (cpu_files(root) / "cpu7" / "topology" / "physical_package_id").read_text() == "-1\n"
    topology = read_sysfs(root)
    assert {p: sorted(c.id for c in topology.cpus.values() if c.package == p) for p in topology.packages} == {
        p: list(range(4 * p, 4 * p + 4)) for p in range(8)}
    assert any("reads -1; packages taken from package_cpus_list / core_siblings_list" in w
               for w in topology.warnings)
    # libvirt turns -1 into socket_id 0: through capabilities the host is one package.
    caps = parse_capabilities(fixtures.libvirt_capabilities(MACHINES["s390x-books"]), name="s390x")
    assert caps.packages == (0,)


def test_node_cpumap_alone_places_every_cpu_on_its_node(sysfs_roots):
    root = sysfs_roots["xeon-2s-cpumap"]
    assert not (node_files(root) / "node1" / "cpulist").exists()
    assert not list((cpu_files(root) / "cpu12").glob("node*"))
    topology = read_sysfs(root)
    assert topology.cpus_in_node(1) == set(range(10, 20)) | set(range(30, 40))
    assert topology.warnings == ()


def test_cpuless_memory_nodes_are_read_with_their_distances(sysfs_roots):
    topology = read_sysfs(sysfs_roots["arm-gpu-memory"])
    assert topology.memory_only_nodes == (1, 2)
    assert [topology.distance(node, 0) for node in (1, 2)] == [40, 30]
    assert topology.nodes[1].memory_kib == 96 * 1024 * 1024
    data = topology.to_dict()
    assert data["memory_only_nodes"] == [1, 2]
    assert [n["memory_only"] for n in data["nodes"]] == [False, True, True]


def test_dies_with_an_llc_each(sysfs_roots):
    topology = read_sysfs(sysfs_roots["epyc-4die-llc"])
    assert set(topology.dies.values()) == set(topology.llc_groups.values())
    assert topology.dies[1] == set(range(4, 8)) | set(range(20, 24))
    assert {core.die for core in topology.cores} == {0, 1, 2, 3}
    assert topology.clusters == {}  # cluster_id 65535: the kernel does not know


def test_without_cache_information_each_die_is_one_llc_and_that_is_said(tmp_path):
    xml = (CAPS_DIR / "epyc-4die-llc.xml").read_text()
    no_banks = re.sub(r"\s*<cache>.*</cache>", "", xml, flags=re.S)
    topology = parse_capabilities(no_banks, name="epyc")
    assert set(topology.llc_groups.values()) == set(topology.dies.values())
    assert len(topology.llc_groups) == 4
    assert topology.warnings == ("<host><cache>: no cache banks; each die is taken as one last-level cache "
                                 "and each core as one L2",)


def test_arm_clusters(sysfs_roots):
    topology = read_sysfs(sysfs_roots["arm-clusters"])
    assert sorted(map(sorted, topology.clusters.values())) == [list(range(i, i + 4)) for i in range(0, 32, 4)]
    assert topology.cpus[5].cluster == topology.core_of(6).cluster != topology.cpus[8].cluster
    assert topology.packages == (36,)


@pytest.mark.parametrize(
    ("clusters", "expected"),
    [
        ([0xFFFF] * 4, 0),  # x86, unknown
        ([-1] * 4, 0),  # the kernel's default
        ([0] * 4, 0),  # libvirt's "no information": one cluster per die
        ([0, 1, 2, 3], 0),  # one cluster per core says nothing new
        ([7, 7, 9, 9], 2),  # real clusters
        ([7, 7, 9, None], 0),  # one CPU without: no cluster level
    ],
)
def test_clusters_are_kept_only_when_they_say_something(clusters, expected):
    facts = [CpuFacts(i, 0, package=0, core_id=i, cluster=c) for i, c in enumerate(clusters)]
    assert len(assemble_topology(facts, {0: Node(0, 1, 1)}).clusters) == expected


def test_core_ids_repeating_per_die_give_distinct_cores_and_dies_numbered_globally():
    facts = [CpuFacts(i, 0, package=i // 4, die=(i // 2) % 2, core_id=i % 2) for i in range(8)]
    topology = assemble_topology(facts, {0: Node(0, 1, 1)})
    assert len(topology.cores) == 8
    assert [topology.cpus[i].die for i in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_packages_from_package_cpus_when_no_cpu_reports_an_id():
    facts = [CpuFacts(i, 0, package=-1, core_id=i, package_cpus=frozenset(range(i - i % 3, i - i % 3 + 3)))
             for i in range(6)]
    topology = assemble_topology(facts, {0: Node(0, 1, 1)})
    assert [topology.cpus[i].package for i in range(6)] == [0, 0, 0, 1, 1, 1]


# ----- warnings for missing optional files, errors for unknowable ones ---------------------------

@pytest.fixture
def private(tmp_path):
    def make(name: str) -> Path:
        return fixtures.write_machine(MACHINES[name], tmp_path)
    return make


def test_clean_trees_have_no_warnings(sysfs_roots):
    quiet = {n for n in MACHINES if n not in ("kvm-no-ids", "empty-cpu0-online", "s390x-books")}
    assert {n: read_sysfs(sysfs_roots[n]).warnings for n in quiet} == {n: () for n in quiet}


def test_missing_cache_directories_warn_once_naming_the_first(private):
    root = private("memory-only-node")
    for cpu in range(16):
        shutil.rmtree(cpu_files(root) / f"cpu{cpu}" / "cache")
    topology = read_sysfs(root)
    assert topology.warnings == (f"{cpu_files(root) / 'cpu0' / 'cache'} (and 15 more like it): missing; such "
                                 "CPUs get one L2 per core and one LLC per die",)
    assert len(topology.llc_groups) == 1 and len(topology.l2_groups) == 8


def test_missing_distance_warns_and_falls_back(private):
    root = private("memory-only-node")
    (node_files(root) / "node1" / "distance").unlink()
    topology = read_sysfs(root)
    assert topology.distance(1, 0) == 20
    assert any("node1/distance: missing" in w for w in topology.warnings)


@pytest.mark.parametrize(
    ("machine", "file", "content", "message"),
    [
        ("kvm-no-ids", "cpu/cpu3/topology/core_cpus_list", "3-", r"bad CPU list element '3-'"),
        ("xeon-2s-masks", "cpu/cpu3/topology/thread_siblings", "zz,00000008", r"bad CPU mask word 'zz'"),
        ("xeon-2s-cpumap", "node/node1/cpumap", "0-3", r"bad CPU mask word '0-3'"),
        ("epyc-4die-llc", "cpu/cpu2/topology/die_id", "two", r"expected an integer, found 'two'"),
        ("empty-cpu0-online", "cpu/cpu2/online", "yes", r"expected 0 or 1, found 'yes'"),
        ("memory-only-node", "node/node0/distance", "10 20 30", r"3 distances for 2 online nodes"),
        ("memory-only-node", "node/node1/meminfo", "Node 1 MemTotal: lots", r"no 'Node N MemTotal: ... kB' line"),
    ],
)
def test_malformed_files_are_one_error_naming_file_and_content(private, machine, file, content, message):
    root = private(machine)
    path = root / "sys" / "devices" / "system" / file
    path.write_text(content + "\n")
    with pytest.raises(SysfsError, match=message) as info:
        read_sysfs(root)
    assert str(path) in str(info.value)


# ----- damaged input: a topology or one clear error, never an exception escaping ------------------

DAMAGEABLE = ("kvm-no-ids", "cpu0-offline-node0", "arm-gpu-memory", "xeon-2s-masks", "s390x-books",
              "xeon-snc-nul", "hybrid-adl", "epyc-4die-llc")


@pytest.fixture(scope="module")
def damageable(tmp_path_factory):
    """Private trees the property test damages and repairs, and every path in each."""
    base = tmp_path_factory.mktemp("damage")
    roots = {name: fixtures.write_machine(MACHINES[name], base) for name in DAMAGEABLE}
    paths = {name: sorted(root.rglob("*")) for name, root in roots.items()}
    return roots, paths, tmp_path_factory.mktemp("removed")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deleted_or_truncated_sysfs_files_give_a_topology_or_one_clear_error(damageable, data):
    roots, all_paths, removed = damageable
    name = data.draw(st.sampled_from(DAMAGEABLE), label="machine")
    root, paths = roots[name], all_paths[name]
    picked = data.draw(st.lists(st.sampled_from(paths), min_size=1, max_size=30, unique=True), label="paths")
    undo: list = []
    try:
        for number, path in enumerate(sorted(picked, key=lambda p: len(p.parts))):
            if not os.path.lexists(path):
                continue  # inside a directory already removed
            if path.is_file() and not path.is_symlink() and data.draw(st.booleans(), label=f"truncate {path}"):
                content = path.read_bytes()
                path.write_bytes(content[:data.draw(st.integers(0, max(0, len(content) - 1)))])
                undo.append(("write", path, content))
            else:
                parked = removed / f"{number}"
                os.rename(path, parked)
                undo.append(("move", path, parked))
        try:
            topology = read_sysfs(root, name=name)
        except SysfsError as exc:
            message = str(exc)
            assert str(root) in message and "\n" not in message
        else:
            online = topology.online_cpus
            assert online and set().union(*topology.llc_groups.values()) == online
            assert all(cpu.node in topology.nodes for cpu in topology.cpus.values())
    finally:
        for action, path, saved in reversed(undo):
            if action == "write":
                path.write_bytes(saved)
            else:
                os.rename(saved, path)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_capabilities_give_a_topology_or_one_clear_error(data):
    name = data.draw(st.sampled_from(fixtures.CAPS_FIXTURES), label="fixture")
    document = etree.fromstring((CAPS_DIR / f"{name}.xml").read_bytes())
    elements = [e for e in document.iter() if e is not document]
    for element in data.draw(st.lists(st.sampled_from(elements), max_size=6, unique=True), label="elements"):
        if data.draw(st.booleans(), label="drop element") and element.getparent() is not None:
            element.getparent().remove(element)
        elif element.attrib:
            attribute = data.draw(st.sampled_from(sorted(element.attrib)), label="attribute")
            if data.draw(st.booleans(), label="drop attribute"):
                del element.attrib[attribute]
            else:
                element.set(attribute, data.draw(st.sampled_from(["", "-1", "x", "65535", "0-", "99"])))
    try:
        topology = parse_capabilities(etree.tostring(document).decode(), name=name, source=f"{name}.xml")
    except CapabilitiesError as exc:
        assert str(exc).startswith(f"{name}.xml: ")
    else:
        assert set().union(*topology.llc_groups.values()) == topology.online_cpus
