"""The sysfs reader on recorded machine trees (tests/data/make_sysfs_fixtures.py) and on this machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.unit import sysfs_fixtures
from vmplacer.adapters.sysfs import SysfsError, read_sysfs

fixtures = sysfs_fixtures.load()
MACHINES = fixtures.machines()


@pytest.fixture
def roots(sysfs_roots) -> dict[str, Path]:
    return sysfs_roots


@pytest.fixture
def one_tree(tmp_path):
    """Write one named machine into a private tree the test may damage."""

    def make(name: str) -> Path:
        return fixtures.write_machine(MACHINES[name], tmp_path)

    return make


def system(root: Path) -> Path:
    return root / "sys" / "devices" / "system"


# ----- every machine: the reader returns what the tree describes ------------------------

def expected_caches(machine, spec, online: set[int]) -> tuple[set[int], set[int]]:
    """(L2 group, LLC group) of an online CPU: as described, whole cores; caches private
    to one CPU (s390x) mean its core, and with no shared level the L2 is the last level."""
    core = {s for s in spec.siblings if s in online}
    if machine.private_caches:
        return core, core
    return {s for s in spec.l2 if s in online}, {s for s in spec.l3 if s in online}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_present_cpu_matches_the_machine_description(roots, name):
    machine = MACHINES[name]
    topology = read_sysfs(roots[name], name=name)
    online = {c.id for c in machine.cpus if c.online}
    assert set(topology.cpus) == {c.id for c in machine.cpus}
    assert topology.online_cpus == online
    for spec in machine.cpus:
        cpu = topology.cpus[spec.id]
        assert cpu.node == spec.node, f"CPU {spec.id}"
        if spec.online:
            assert cpu.package == spec.package, f"CPU {spec.id}"
            assert topology.siblings(spec.id) == {s for s in spec.siblings if s in online}
            l2, llc = expected_caches(machine, spec, online)
            assert topology.cpus_in_llc(cpu.llc) == llc, f"CPU {spec.id}"
            assert topology.l2_groups[cpu.l2] == l2, f"CPU {spec.id}"


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_nodes_memory_distances_and_hugepages_match(roots, name):
    machine = MACHINES[name]
    topology = read_sysfs(roots[name], name=name)
    node_ids = [n.id for n in machine.nodes]
    assert sorted(topology.nodes) == node_ids
    for spec in machine.nodes:
        node = topology.nodes[spec.id]
        assert (node.memory_kib, node.free_kib) == (spec.mem_total_kib, spec.mem_free_kib)
        assert node.distances == dict(zip(node_ids, spec.distances, strict=True))
        assert {p.size_kib: (p.total, p.free) for p in node.hugepages} == spec.hugepages


# ----- the kernel's special cases -------------------------------------------------------

def test_offline_cpu_is_listed_offline_in_the_node_its_link_names(roots):
    root = roots["xeon-2s-sparse"]
    cpu_dir = system(root) / "cpu" / "cpu43"
    assert not (cpu_dir / "topology").exists()  # what makes this case hard
    assert "43" not in (system(root) / "node" / "node1" / "cpulist").read_text()
    topology = read_sysfs(root)
    cpu = topology.cpus[43]
    assert (cpu.online, cpu.node, cpu.package, cpu.llc, cpu.l2) == (False, 1, 1, None, None)
    assert topology.siblings(11) == {11}  # its sibling lost its partner
    assert topology.core_of(43).cpus == (43,)
    assert all(43 not in core.cpus for core in topology.free_cores(None, set()))


def test_offline_cpu_without_link_or_cpulist_falls_back_to_the_lowest_node(one_tree):
    root = one_tree("xeon-2s-sparse")
    (system(root) / "cpu" / "cpu43" / "node1").unlink()
    assert read_sysfs(root).cpus[43].node == 0


def test_online_cpu_node_comes_from_cpulist_when_the_link_is_missing(one_tree):
    root = one_tree("amd-nps2")
    node = next(c.node for c in MACHINES["amd-nps2"].cpus if c.id == 28)
    assert node != 0
    (system(root) / "cpu" / "cpu28" / f"node{node}").unlink()
    assert read_sysfs(root).cpus[28].node == node


def test_cpu_online_flag_overrides_the_online_list(one_tree):
    root = one_tree("memory-only-node")
    (system(root) / "cpu" / "cpu5" / "online").write_text("0\n")
    assert 5 not in read_sysfs(root).online_cpus


def test_without_present_and_possible_lists_the_cpu_directories_count(one_tree):
    root = one_tree("power9-smt4")
    for list_name in ("present", "possible"):
        (system(root) / "cpu" / list_name).unlink()
    assert set(read_sysfs(root).cpus) == {c.id for c in MACHINES["power9-smt4"].cpus}


def test_hybrid_cpus_carry_their_kind(roots):
    topology = read_sysfs(roots["hybrid-adl"])
    kinds = {cpu.id: cpu.kind for cpu in topology.cpus.values()}
    assert {c for c, k in kinds.items() if k == "performance"} == set(range(16))
    assert {c for c, k in kinds.items() if k == "efficiency"} == set(range(16, 20))
    e_cores = [core for core in topology.cores if topology.cpus[core.cpus[0]].kind == "efficiency"]
    assert [len(core.cpus) for core in e_cores] == [1, 1, 1, 1]
    assert topology.smt == 2


def test_old_kernel_without_die_id_and_core_cpus_list(roots):
    root = roots["power9-smt4"]
    assert not (system(root) / "cpu" / "cpu0" / "topology" / "core_cpus_list").exists()
    topology = read_sysfs(root)
    assert topology.smt == 4
    assert topology.siblings(6) == {4, 5, 6, 7}
    assert topology.nodes[8].distances == {0: 40, 8: 10}
    assert topology.packages == (0, 8)


def test_memory_only_node_has_memory_and_no_cpus(roots):
    topology = read_sysfs(roots["memory-only-node"])
    assert topology.nodes_with_cpus() == (0,)
    assert topology.cpus_in_node(1) == frozenset()
    assert topology.nodes[1].memory_kib == 256 * 1024 * 1024
    assert topology.distance(0, 1) == 20


def test_isolated_cpus_are_read(roots):
    assert read_sysfs(roots["xeon-2s-sparse"]).isolated == {4, 5, 36, 37}


def test_kernel_without_numa_gives_one_node_from_proc_meminfo(one_tree):
    root = one_tree("memory-only-node")
    shutil.rmtree(system(root) / "node")
    (root / "proc").mkdir()
    (root / "proc" / "meminfo").write_text("MemTotal:  1000 kB\nMemFree:  600 kB\nMemAvailable:  800 kB\n")
    topology = read_sysfs(root)
    assert list(topology.nodes) == [0]
    assert (topology.nodes[0].memory_kib, topology.nodes[0].free_kib) == (1000, 800)
    assert topology.cpus_in_node(0) == frozenset(range(16))


# ----- bad trees: errors name the file ----------------------------------------------------

def test_root_without_sysfs_is_an_error_naming_the_directory(tmp_path):
    with pytest.raises(SysfsError, match=r"sys/devices/system/cpu"):
        read_sysfs(tmp_path)


def test_garbage_core_id_names_the_file(one_tree):
    root = one_tree("memory-only-node")
    bad = system(root) / "cpu" / "cpu3" / "topology" / "core_id"
    bad.write_text("three\n")
    with pytest.raises(SysfsError, match=str(bad)):
        read_sysfs(root)


def test_distance_count_mismatch_names_the_file(one_tree):
    root = one_tree("amd-nps2")
    bad = system(root) / "node" / "node2" / "distance"
    bad.write_text("10 11\n")
    with pytest.raises(SysfsError, match=rf"{bad}: 2 distances for 4 online nodes"):
        read_sysfs(root)


def test_contradicting_sibling_lists_are_an_error_naming_the_cpus(one_tree):
    root = one_tree("memory-only-node")
    (system(root) / "cpu" / "cpu9" / "topology" / "core_cpus_list").write_text("2,9\n")
    with pytest.raises(SysfsError, match=r"CPU \d+ reports SMT siblings"):
        read_sysfs(root)


def test_missing_meminfo_names_the_file(one_tree):
    root = one_tree("memory-only-node")
    (system(root) / "node" / "node1" / "meminfo").unlink()
    with pytest.raises(SysfsError, match=r"node1/meminfo: cannot read"):
        read_sysfs(root)


# ----- this machine -------------------------------------------------------------------------

def _proc_cpuinfo() -> dict[int, dict[str, str]]:
    processors: dict[int, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines() + [""]:
        if not line.strip():
            if "processor" in current:
                processors[int(current["processor"])] = current
            current = {}
            continue
        key, _, value = line.partition(":")
        current[key.strip()] = value.strip()
    return processors


def test_this_machine_agrees_with_proc_and_psutil():
    import psutil

    topology = read_sysfs("/", name="self")
    assert len(topology.online_cpus) == os.cpu_count()
    for cpu_id, info in _proc_cpuinfo().items():
        if "physical id" in info:  # x86 prints the package and core of each online CPU
            assert topology.cpus[cpu_id].package == int(info["physical id"])
            assert len(topology.siblings(cpu_id)) * int(info["cpu cores"]) == int(info["siblings"])
    physical = psutil.cpu_count(logical=False)
    if physical:
        assert sum(1 for core in topology.cores if set(core.cpus) & topology.online_cpus) == physical
    # Node memory can be less than MemTotal (memory not yet onlined in a node), never more.
    total_kib = sum(node.memory_kib for node in topology.nodes.values())
    assert 0 < total_kib <= psutil.virtual_memory().total / 1024
    assert all(0 <= node.free_kib <= node.memory_kib for node in topology.nodes.values())
