#!/usr/bin/env python3
"""Write sysfs trees of named machines: `make_sysfs_fixtures.py OUT_DIR`.

The tests build these trees in a temporary directory (`build_all`), so the
description below is the single source of the fixtures; run the script to
get a tree to point `vmplacer topology --sysfs` at.

Each tree is a ROOT for `read_sysfs`: it holds the files the kernel exposes
under sys/devices/system/{cpu,node} (and sys/devices/cpu_core|cpu_atom on hybrid
hosts), laid out as the kernel lays them out — including what it leaves out:
an offline CPU has no topology/ or cache/ directory and is dropped from its
node's cpulist (x86), keeping only its cpuN/nodeM link.

Machines:
- xeon-2s-sparse: 2 sockets x 6 cores x SMT-2, CPU ids 0-11 and 32-43 (siblings
  n / n+32), hardware core ids 0,1,2,8,9,10 per socket, CPU 43 offline,
  isolcpus=4-5,36-37, hugepages on both nodes.
- power9-smt4: 2 chips (packages and NUMA nodes 0 and 8) x 8 cores x SMT-4,
  threads of a core numbered consecutively, L2 and L3 shared by core pairs,
  an older kernel (no die_id, no core_cpus_list).
- hybrid-adl: Alder Lake, 8 P cores (SMT-2, siblings adjacent) + 4 E cores
  sharing one L2, one node.
- memory-only-node: 1 socket x 8 cores x SMT-2 on node 0, node 1 holds only
  memory (CXL-like), distance 20.
- amd-nps2: 2 sockets x 16 cores x SMT-2, NPS2 (2 NUMA nodes per socket,
  distances 10/11/32), L3 per 4-core CCX.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CpuSpec:
    id: int
    node: int
    package: int
    core_id: int
    siblings: tuple[int, ...]
    online: bool = True
    die: int = 0
    l2: tuple[int, ...] = ()
    l3: tuple[int, ...] = ()
    l2_id: int = 0
    l3_id: int = 0


@dataclass
class NodeSpec:
    id: int
    mem_total_kib: int
    mem_free_kib: int
    distances: tuple[int, ...]  # to the online nodes, in id order
    hugepages: dict[int, tuple[int, int]] = field(default_factory=dict)  # size kB -> (nr, free)


@dataclass
class Machine:
    name: str
    cpus: list[CpuSpec]
    nodes: list[NodeSpec]
    isolated: tuple[int, ...] = ()
    hybrid: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pmu dir -> cpus
    old_kernel: bool = False  # no die_id, no core_cpus_list


def cpulist(cpus: tuple[int, ...] | list[int] | set[int]) -> str:
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_machine(machine: Machine, out_dir: Path) -> Path:
    """Write `machine` as OUT_DIR/<name>/sys/...; returns the ROOT to read."""
    root = Path(out_dir) / machine.name
    if root.exists():
        shutil.rmtree(root)
    system = root / "sys" / "devices" / "system"
    cpu_dir = system / "cpu"
    present = [c.id for c in machine.cpus]
    online = [c.id for c in machine.cpus if c.online]
    write(cpu_dir / "possible", cpulist(range(max(present) + 1 + 8)))  # spare hotplug slots
    write(cpu_dir / "present", cpulist(present))
    write(cpu_dir / "online", cpulist(online))
    write(cpu_dir / "offline", cpulist(set(range(max(present) + 1 + 8)) - set(online)))
    write(cpu_dir / "isolated", cpulist(machine.isolated))
    write(cpu_dir / "kernel_max", "8191")
    smt = max(len(c.siblings) for c in machine.cpus)
    write(cpu_dir / "smt" / "control", "on" if smt > 1 else "notsupported")
    write(cpu_dir / "smt" / "active", "1" if smt > 1 else "0")

    by_package: dict[int, list[int]] = {}
    for cpu in machine.cpus:
        if cpu.online:
            by_package.setdefault(cpu.package, []).append(cpu.id)
    for cpu in machine.cpus:
        base = cpu_dir / f"cpu{cpu.id}"
        base.mkdir(parents=True, exist_ok=True)
        if cpu.id != 0:
            write(base / "online", "1" if cpu.online else "0")
        (base / f"node{cpu.node}").symlink_to(f"../../node/node{cpu.node}")
        if not cpu.online:
            continue  # the kernel removes topology/ and cache/ of an offline CPU
        online_siblings = tuple(s for s in cpu.siblings if s in online)
        topo = base / "topology"
        write(topo / "physical_package_id", str(cpu.package))
        write(topo / "core_id", str(cpu.core_id))
        write(topo / "thread_siblings_list", cpulist(online_siblings))
        write(topo / "core_siblings_list", cpulist(by_package[cpu.package]))
        if not machine.old_kernel:
            write(topo / "die_id", str(cpu.die))
            write(topo / "core_cpus_list", cpulist(online_siblings))
            write(topo / "package_cpus_list", cpulist(by_package[cpu.package]))
        cache = base / "cache"
        entries = [
            (1, "Data", online_siblings, cpu.core_id, "48K"),
            (1, "Instruction", online_siblings, cpu.core_id, "32K"),
            (2, "Unified", tuple(s for s in cpu.l2 if s in online), cpu.l2_id, "1280K"),
            (3, "Unified", tuple(s for s in cpu.l3 if s in online), cpu.l3_id, "32768K"),
        ]
        for index, (level, kind, shared, cache_id, size) in enumerate(entries):
            if not shared:
                continue
            d = cache / f"index{index}"
            write(d / "level", str(level))
            write(d / "type", kind)
            write(d / "shared_cpu_list", cpulist(shared))
            write(d / "id", str(cache_id))
            write(d / "size", size)

    node_dir = system / "node"
    node_ids = [n.id for n in machine.nodes]
    write(node_dir / "possible", cpulist(node_ids))
    write(node_dir / "online", cpulist(node_ids))
    write(node_dir / "has_cpu", cpulist({c.node for c in machine.cpus}))
    write(node_dir / "has_memory", cpulist(n.id for n in machine.nodes if n.mem_total_kib))
    for node in machine.nodes:
        base = node_dir / f"node{node.id}"
        # x86 drops offline CPUs from the node's cpulist.
        write(base / "cpulist", cpulist([c.id for c in machine.cpus if c.node == node.id and c.online]))
        write(base / "distance", " ".join(str(d) for d in node.distances))
        used = node.mem_total_kib - node.mem_free_kib
        lines = [
            f"Node {node.id} MemTotal:       {node.mem_total_kib:>10} kB",
            f"Node {node.id} MemFree:        {node.mem_free_kib:>10} kB",
            f"Node {node.id} MemUsed:        {used:>10} kB",
            f"Node {node.id} Active:         {used // 2:>10} kB",
            f"Node {node.id} HugePages_Total: {node.hugepages.get(2048, (0, 0))[0]:>5}",
            f"Node {node.id} HugePages_Free:  {node.hugepages.get(2048, (0, 0))[1]:>5}",
            f"Node {node.id} HugePages_Surp:      0",
        ]
        write(base / "meminfo", "\n".join(lines))
        for size, (nr, free) in node.hugepages.items():
            pool = base / "hugepages" / f"hugepages-{size}kB"
            write(pool / "nr_hugepages", str(nr))
            write(pool / "free_hugepages", str(free))
            write(pool / "surplus_hugepages", "0")

    for pmu, cpus in machine.hybrid.items():
        write(root / "sys" / "devices" / pmu / "cpus", cpulist(cpus))
    return root


def libvirt_capabilities(machine: Machine) -> str:
    """The <capabilities> libvirt builds from this tree, by libvirt's own rules.

    libvirt takes each cell's CPUs from the node's cpumap (offline CPUs are not
    in it on x86), the topology attributes from cpuN/topology (die_id 0 when
    the kernel has none), and reports only L3 cache banks.
    """
    online = {c.id for c in machine.cpus if c.online}
    lines = ["<capabilities>", "  <host>", "    <cpu>", "      <arch>x86_64</arch>",
             "      <pages unit='KiB' size='4'/>", "    </cpu>", "    <topology>",
             f"      <cells num='{len(machine.nodes)}'>"]
    for node in machine.nodes:
        lines.append(f"        <cell id='{node.id}'>")
        lines.append(f"          <memory unit='KiB'>{node.mem_total_kib}</memory>")
        lines.append(f"          <pages unit='KiB' size='4'>{node.mem_total_kib // 4}</pages>")
        for size, (nr, _free) in sorted(node.hugepages.items()):
            lines.append(f"          <pages unit='KiB' size='{size}'>{nr}</pages>")
        lines.append("          <distances>")
        for other, value in zip((n.id for n in machine.nodes), node.distances, strict=True):
            lines.append(f"            <sibling id='{other}' value='{value}'/>")
        lines.append("          </distances>")
        members = [c for c in machine.cpus if c.node == node.id and c.online]
        lines.append(f"          <cpus num='{len(members)}'>")
        for cpu in members:
            die = 0 if machine.old_kernel else cpu.die
            siblings = cpulist([s for s in cpu.siblings if s in online])
            lines.append(f"            <cpu id='{cpu.id}' socket_id='{cpu.package}' die_id='{die}' "
                         f"core_id='{cpu.core_id}' siblings='{siblings}'/>")
        lines += ["          </cpus>", "        </cell>"]
    lines += ["      </cells>", "    </topology>", "    <cache>"]
    banks = {}
    for cpu in machine.cpus:
        if cpu.online and cpu.l3:
            banks[cpu.l3_id] = [s for s in cpu.l3 if s in online]
    for bank_id, cpus in sorted(banks.items()):
        lines.append(f"      <bank id='{bank_id}' level='3' type='both' size='32' unit='MiB' "
                     f"cpus='{cpulist(cpus)}'/>")
    lines += ["    </cache>", "  </host>", "</capabilities>"]
    return "\n".join(lines) + "\n"


# ----- the machines ---------------------------------------------------------------------

GIB = 1024 * 1024


def xeon_2s_sparse() -> Machine:
    hw_core_ids = (0, 1, 2, 8, 9, 10)
    cpus = []
    for package in range(2):
        first = [package * 6 + i for i in range(6)]
        socket_cpus = tuple(first + [c + 32 for c in first])
        for i, core_id in enumerate(hw_core_ids):
            pair = (package * 6 + i, package * 6 + i + 32)
            for cpu_id in pair:
                cpus.append(
                    CpuSpec(
                        id=cpu_id, node=package, package=package, core_id=core_id, siblings=pair,
                        online=cpu_id != 43, l2=pair, l3=socket_cpus, l2_id=pair[0] * 2,
                        l3_id=package,
                    )
                )
    nodes = [
        NodeSpec(0, 96 * GIB, 80 * GIB, (10, 21), {2048: (1024, 1000), 1048576: (4, 4)}),
        NodeSpec(1, 96 * GIB, 90 * GIB, (21, 10), {2048: (1024, 1024), 1048576: (0, 0)}),
    ]
    return Machine("xeon-2s-sparse", cpus, nodes, isolated=(4, 5, 36, 37))


def power9_smt4() -> Machine:
    cpus = []
    for chip_index, chip in enumerate((0, 8)):
        for core in range(8):
            first = chip_index * 32 + core * 4
            threads = tuple(range(first, first + 4))
            pair_first = chip_index * 32 + (core // 2) * 8
            pair = tuple(range(pair_first, pair_first + 8))
            for cpu_id in threads:
                cpus.append(
                    CpuSpec(
                        id=cpu_id, node=chip, package=chip, core_id=first, siblings=threads,
                        l2=pair, l3=pair, l2_id=pair_first, l3_id=pair_first,
                    )
                )
    nodes = [
        NodeSpec(0, 128 * GIB, 120 * GIB, (10, 40), {2048: (0, 0), 1048576: (8, 6)}),
        NodeSpec(8, 128 * GIB, 126 * GIB, (40, 10), {2048: (0, 0), 1048576: (8, 8)}),
    ]
    return Machine("power9-smt4", cpus, nodes, old_kernel=True)


def hybrid_adl() -> Machine:
    cpus = []
    all_cpus = tuple(range(20))
    for p_core in range(8):
        pair = (2 * p_core, 2 * p_core + 1)
        for cpu_id in pair:
            cpus.append(
                CpuSpec(id=cpu_id, node=0, package=0, core_id=4 * p_core, siblings=pair,
                        l2=pair, l3=all_cpus, l2_id=p_core, l3_id=0)
            )
    e_cluster = tuple(range(16, 20))
    for i, cpu_id in enumerate(e_cluster):
        cpus.append(
            CpuSpec(id=cpu_id, node=0, package=0, core_id=32 + i, siblings=(cpu_id,),
                    l2=e_cluster, l3=all_cpus, l2_id=8, l3_id=0)
        )
    nodes = [NodeSpec(0, 32 * GIB, 28 * GIB, (10,), {2048: (512, 500), 1048576: (0, 0)})]
    return Machine("hybrid-adl", cpus, nodes,
                   hybrid={"cpu_core": tuple(range(16)), "cpu_atom": e_cluster})


def memory_only_node() -> Machine:
    cpus = []
    all_cpus = tuple(range(16))
    for core in range(8):
        pair = (core, core + 8)
        for cpu_id in pair:
            cpus.append(
                CpuSpec(id=cpu_id, node=0, package=0, core_id=core, siblings=pair,
                        l2=pair, l3=all_cpus, l2_id=core, l3_id=0)
            )
    nodes = [
        NodeSpec(0, 64 * GIB, 60 * GIB, (10, 20), {2048: (256, 256)}),
        NodeSpec(1, 256 * GIB, 256 * GIB, (20, 10)),
    ]
    return Machine("memory-only-node", cpus, nodes)


def amd_nps2() -> Machine:
    cpus = []
    for package in range(2):
        for core in range(16):
            first = package * 16 + core
            pair = (first, first + 32)
            ccx_first = package * 16 + (core // 4) * 4
            ccx = tuple(range(ccx_first, ccx_first + 4)) + tuple(range(ccx_first + 32, ccx_first + 36))
            node = package * 2 + core // 8
            for cpu_id in pair:
                cpus.append(
                    CpuSpec(id=cpu_id, node=node, package=package, core_id=core, siblings=pair,
                            l2=pair, l3=ccx, l2_id=first, l3_id=ccx_first // 4)
                )
    distances = [[10 if a == b else 11 if a // 2 == b // 2 else 32 for b in range(4)] for a in range(4)]
    nodes = [
        NodeSpec(n, 64 * GIB, (60 - n) * GIB, tuple(distances[n]), {2048: (128, 128 - 16 * n), 1048576: (2, 2)})
        for n in range(4)
    ]
    return Machine("amd-nps2", cpus, nodes)


MACHINES = (xeon_2s_sparse, power9_smt4, hybrid_adl, memory_only_node, amd_nps2)


def build_all(out_dir: Path) -> dict[str, Path]:
    """Write every machine under OUT_DIR; returns name -> ROOT."""
    roots = {}
    for make in MACHINES:
        machine = make()
        roots[machine.name] = write_machine(machine, out_dir)
    return roots


def machines() -> dict[str, Machine]:
    return {machine.name: machine for machine in (make() for make in MACHINES)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the trees into")
    for name, root in build_all(parser.parse_args().out_dir).items():
        print(f"{name}: {root}")


if __name__ == "__main__":
    main()
