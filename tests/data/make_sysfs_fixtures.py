#!/usr/bin/env python3
"""Write sysfs trees and libvirt capabilities of named machines.

    make_sysfs_fixtures.py OUT_DIR   one sysfs tree per machine under OUT_DIR
    make_sysfs_fixtures.py --caps    rewrite tests/data/capabilities/*.xml

The tests build the trees in a temporary directory (`build_all`), so the
descriptions below are the single source of the fixtures; run the script to
get a tree to point `vmplacer topology --sysfs` at.

Each tree is a ROOT for `read_sysfs`: it holds the files the kernel exposes
under sys/devices/system/{cpu,node} (and sys/devices/cpu_core|cpu_atom on hybrid
hosts), laid out as the kernel lays them out — including what it leaves out:
an offline CPU has no topology/ or cache/ directory and is dropped from its
node's cpulist (x86), keeping only its cpuN/nodeM link. CPU sets are written
as lists, plus the hex masks old kernels offer alone (`thread_siblings`,
`core_siblings`, a node's `cpumap`: 32-bit words, the first as wide as
nr_cpu_ids needs); `shared_cpu_map` only where a machine has no lists (the
kernel writes both; the trees stay small).

`libvirt_capabilities` writes what libvirt's capabilities code builds from
the same tree (src/conf/capabilities.c, src/util/virhostcpu.c).

Machines, one per kind of host the readers must handle:
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
- xeon-snc-nul: 2 sockets x 2 nodes (sub-NUMA clusters) x 4 cores x SMT-2;
  every file ends in a NUL byte after its newline, as some dump tools write.
- xeon-2s-masks: 2 sockets x 10 cores x SMT-2 on a very old kernel: CPU sets
  only as hex masks (`thread_siblings`, `core_siblings`, `shared_cpu_map`),
  two 32-bit words each; no die_id, no cache ids.
- kvm-no-ids: a guest whose kernel gives no `core_id` and no
  `physical_package_id` (nor package CPU lists): 4 cores x SMT-2, one node.
- empty-cpu0-online: 4 cores x SMT-2 whose `cpu0/online` exists but is empty.
- cpu0-offline-node0: node 0 (CPUs 0-3, no memory left) went offline with
  CPU 0; `node/online` says 1 but distance rows still carry node 0.
- s390x-books: 2 drawers x 2 books x 2 sockets x 2 cores x SMT-2;
  `physical_package_id` -1, sockets only in `core_siblings_list`, book and
  drawer ids, caches private to each CPU (s390x shows no shared cache).
- xeon-2s-cpumap: 2 sockets x 10 cores x SMT-2; node directories give only
  the `cpumap` mask and CPUs have no nodeM links (older kernels).
- arm-gpu-memory: 16 ARM cores on node 0, GPU memory as CPU-less node 1 and
  a CXL tier as CPU-less node 2 (distances illustrative), cluster_id -1.
- epyc-4die-llc: 1 package, 4 dies x 4 cores x SMT-2, one L3 per die, core
  ids restarting per die, cluster_id 65535 (x86: unknown), one node.
- arm-clusters: 1 package (id 36), 2 nodes x 16 cores, clusters of 4 cores,
  L2 per core, L3 per node, no die_id (arm64 has none).
- ia64-montecito: Itanium 2, 2 sockets x 2 cores x 2 threads, one node, an
  old kernel with masks only (as xeon-2s-masks); L2 and L3 private to each
  core, so every core is its own LLC.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from pathlib import Path

CAPS_DIR = Path(__file__).resolve().parent / "capabilities"
CAPS_FIXTURES = ("epyc-4die-llc", "arm-clusters", "arm-gpu-memory", "cpu0-offline-node0", "hybrid-adl")


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
    cluster_id: int | None = None  # None: the kernel writes no cluster_id
    book: int | None = None  # s390x
    drawer: int | None = None  # s390x


@dataclass
class NodeSpec:
    id: int
    mem_total_kib: int
    mem_free_kib: int
    distances: tuple[int, ...]  # the node's distance row: one entry per node of the machine, in id order
    hugepages: dict[int, tuple[int, int]] = field(default_factory=dict)  # size kB -> (nr, free)
    online: bool = True


@dataclass
class Machine:
    name: str
    cpus: list[CpuSpec]
    nodes: list[NodeSpec]
    isolated: tuple[int, ...] = ()
    hybrid: dict[str, tuple[int, ...]] = field(default_factory=dict)  # pmu dir -> cpus
    old_kernel: bool = False  # no die_id, no core_cpus*, no package_cpus*
    arch: str = "x86_64"
    nul_padding: bool = False  # every file ends in "\n\0"
    masks_only: bool = False  # CPU sets only as hex masks, no die_id, no cache ids
    node_cpumap_only: bool = False  # nodes give only cpumap; CPUs have no nodeM links
    omit_topology: tuple[str, ...] = ()  # topology files this kernel does not write
    package_id: int | None = None  # written to every physical_package_id instead of the package
    empty_online: tuple[int, ...] = ()  # CPUs whose online file exists but is empty
    private_caches: bool = False  # caches list only the CPU itself; no shared level (s390x)


def cpulist(cpus: tuple[int, ...] | list[int] | set[int] | range) -> str:
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


def cpumask(cpus: tuple[int, ...] | list[int] | set[int], nbits: int) -> str:
    """The kernel's mask form: 32-bit hex words, most significant first, the first as wide as needed."""
    words = max(1, -(-nbits // 32))
    value = sum(1 << c for c in set(cpus))
    parts = [f"{(value >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words))]
    first_bits = nbits - 32 * (words - 1)
    parts[0] = parts[0][-max(1, -(-first_bits // 4)):]
    return ",".join(parts)


def write(path: Path, text: str, nul: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((text + "\n" if text else "") + ("\x00" if nul else ""))


def write_machine(machine: Machine, out_dir: Path) -> Path:
    """Write `machine` as OUT_DIR/<name>/sys/...; returns the ROOT to read."""
    root = Path(out_dir) / machine.name
    if root.exists():
        shutil.rmtree(root)

    def put(path: Path, text: str) -> None:
        write(path, text, machine.nul_padding)

    system = root / "sys" / "devices" / "system"
    cpu_dir = system / "cpu"
    present = [c.id for c in machine.cpus]
    online = {c.id for c in machine.cpus if c.online}
    nbits = max(present) + 1 + 8  # nr_cpu_ids: spare hotplug slots
    put(cpu_dir / "possible", cpulist(range(nbits)))
    put(cpu_dir / "present", cpulist(present))
    put(cpu_dir / "online", cpulist(online))
    put(cpu_dir / "offline", cpulist(set(range(nbits)) - online))
    put(cpu_dir / "isolated", cpulist(machine.isolated))
    put(cpu_dir / "kernel_max", "8191")
    smt = max(len(c.siblings) for c in machine.cpus)
    put(cpu_dir / "smt" / "control", "on" if smt > 1 else "notsupported")
    put(cpu_dir / "smt" / "active", "1" if smt > 1 else "0")

    for cpu in machine.cpus:
        base = cpu_dir / f"cpu{cpu.id}"
        base.mkdir(parents=True, exist_ok=True)
        if cpu.id in machine.empty_online:
            put(base / "online", "")
        elif cpu.id != 0 or not cpu.online:
            put(base / "online", "1" if cpu.online else "0")
        if not machine.node_cpumap_only:
            (base / f"node{cpu.node}").symlink_to(f"../../node/node{cpu.node}")
        if not cpu.online:
            continue  # the kernel removes topology/ and cache/ of an offline CPU
        for file_name, text in topology_files(machine, cpu, online, nbits).items():
            put(base / "topology" / file_name, text)
        for index, (level, kind, shared, cache_id, size) in enumerate(cache_entries(machine, cpu, online)):
            d = base / "cache" / f"index{index}"
            put(d / "level", str(level))
            put(d / "type", kind)
            put(d / "size", size)
            if machine.masks_only:
                put(d / "shared_cpu_map", cpumask(shared, nbits))
            else:
                put(d / "shared_cpu_list", cpulist(shared))
                put(d / "id", str(cache_id))

    node_dir = system / "node"
    node_ids = [n.id for n in machine.nodes]
    put(node_dir / "possible", cpulist(node_ids))
    put(node_dir / "online", cpulist(n.id for n in machine.nodes if n.online))
    put(node_dir / "has_cpu", cpulist({c.node for c in machine.cpus if c.online}))
    put(node_dir / "has_memory", cpulist(n.id for n in machine.nodes if n.mem_total_kib))
    for node in machine.nodes:
        base = node_dir / f"node{node.id}"
        # x86 drops offline CPUs from the node's CPU list.
        members = [c.id for c in machine.cpus if c.node == node.id and c.online]
        put(base / "cpumap", cpumask(members, nbits))
        if not machine.node_cpumap_only:
            put(base / "cpulist", cpulist(members))
        put(base / "distance", " ".join(str(d) for d in node.distances))
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
        put(base / "meminfo", "\n".join(lines))
        for size, (nr, free) in node.hugepages.items():
            pool = base / "hugepages" / f"hugepages-{size}kB"
            put(pool / "nr_hugepages", str(nr))
            put(pool / "free_hugepages", str(free))
            put(pool / "surplus_hugepages", "0")

    for pmu, cpus in machine.hybrid.items():
        put(root / "sys" / "devices" / pmu / "cpus", cpulist(cpus))
    return root


def topology_files(machine: Machine, cpu: CpuSpec, online: set[int], nbits: int) -> dict[str, str]:
    """cpuN/topology/* of an online CPU, as this machine's kernel writes them."""
    siblings = [s for s in cpu.siblings if s in online]
    package = [c.id for c in machine.cpus if c.online and c.package == cpu.package]
    die = [c.id for c in machine.cpus if c.online and (c.package, c.die) == (cpu.package, cpu.die)]
    files = {
        "physical_package_id": str(cpu.package if machine.package_id is None else machine.package_id),
        "core_id": str(cpu.core_id),
        "thread_siblings": cpumask(siblings, nbits),
        "core_siblings": cpumask(package, nbits),
    }
    if not machine.masks_only:
        files["thread_siblings_list"] = cpulist(siblings)
        files["core_siblings_list"] = cpulist(package)
        if not machine.old_kernel:
            files |= {
                "die_id": str(cpu.die),
                "die_cpus_list": cpulist(die),
                "core_cpus_list": cpulist(siblings),
                "package_cpus_list": cpulist(package),
            }
        if cpu.cluster_id is not None:
            real = 0 <= cpu.cluster_id != 0xFFFF
            cluster = [c.id for c in machine.cpus if c.online and c.package == cpu.package
                       and c.cluster_id == cpu.cluster_id] if real else siblings
            files |= {"cluster_id": str(cpu.cluster_id), "cluster_cpus_list": cpulist(cluster)}
        if cpu.book is not None:
            book = [c.id for c in machine.cpus if c.online and (c.drawer, c.book) == (cpu.drawer, cpu.book)]
            drawer = [c.id for c in machine.cpus if c.online and c.drawer == cpu.drawer]
            files |= {"book_id": str(cpu.book), "drawer_id": str(cpu.drawer),
                      "book_siblings_list": cpulist(book), "drawer_siblings_list": cpulist(drawer)}
    return {name: text for name, text in files.items() if name not in machine.omit_topology}


def cache_entries(machine: Machine, cpu: CpuSpec, online: set[int]) -> list[tuple[int, str, tuple[int, ...], int, str]]:
    """(level, type, sharing CPUs, id, size) of each cache/indexN of an online CPU."""
    if machine.private_caches:
        alone = (cpu.id,)
        return [(1, "Data", alone, cpu.id, "128K"), (1, "Instruction", alone, cpu.id, "128K"),
                (2, "Data", alone, cpu.id, "4096K"), (2, "Instruction", alone, cpu.id, "4096K")]
    siblings = tuple(s for s in cpu.siblings if s in online)
    entries = [
        (1, "Data", siblings, cpu.core_id, "48K"),
        (1, "Instruction", siblings, cpu.core_id, "32K"),
        (2, "Unified", tuple(s for s in cpu.l2 if s in online), cpu.l2_id, "1280K"),
        (3, "Unified", tuple(s for s in cpu.l3 if s in online), cpu.l3_id, "32768K"),
    ]
    return [entry for entry in entries if entry[2]]


def libvirt_capabilities(machine: Machine) -> str:
    """The <capabilities> libvirt builds from this tree, by libvirt's own rules.

    - cells: the online nodes; each cell's CPUs from the node's cpumap (offline
      CPUs are not in it on x86);
    - per CPU: socket_id = physical_package_id, 0 when missing or negative;
      die_id and cluster_id likewise (65535 passes through); core_id 0 when
      missing; siblings = thread_siblings_list, the CPU alone when missing;
    - distances: the node's row, one sibling per node;
    - caches: banks of level 3 and up from each online CPU's shared_cpu_list;
      when one is missing libvirt drops cache reporting altogether.
    """
    online = {c.id for c in machine.cpus if c.online}
    nbits = max(c.id for c in machine.cpus) + 1 + 8
    topo = {c.id: topology_files(machine, c, online, nbits) for c in machine.cpus if c.online}

    def number(cpu: int, file_name: str) -> int:
        value = int(topo[cpu].get(file_name, "0"))
        return value if value >= 0 else 0

    lines = ["<capabilities>", "  <host>", "    <cpu>", f"      <arch>{machine.arch}</arch>",
             "      <pages unit='KiB' size='4'/>", "    </cpu>", "    <topology>"]
    cells = [n for n in machine.nodes if n.online]
    lines.append(f"      <cells num='{len(cells)}'>")
    for node in cells:
        lines.append(f"        <cell id='{node.id}'>")
        if node.mem_total_kib:
            lines.append(f"          <memory unit='KiB'>{node.mem_total_kib}</memory>")
        lines.append(f"          <pages unit='KiB' size='4'>{node.mem_total_kib // 4}</pages>")
        for size, (nr, _free) in sorted(node.hugepages.items()):
            lines.append(f"          <pages unit='KiB' size='{size}'>{nr}</pages>")
        lines.append("          <distances>")
        for other, value in zip((n.id for n in machine.nodes), node.distances, strict=True):
            lines.append(f"            <sibling id='{other}' value='{value}'/>")
        lines.append("          </distances>")
        members = [c for c in machine.cpus if c.node == node.id and c.online]
        if members:
            lines.append(f"          <cpus num='{len(members)}'>")
            for cpu in members:
                siblings = topo[cpu.id].get("thread_siblings_list", str(cpu.id))
                lines.append(
                    f"            <cpu id='{cpu.id}' socket_id='{number(cpu.id, 'physical_package_id')}' "
                    f"die_id='{number(cpu.id, 'die_id')}' cluster_id='{number(cpu.id, 'cluster_id')}' "
                    f"core_id='{number(cpu.id, 'core_id')}' siblings='{siblings}'/>")
            lines.append("          </cpus>")
        lines.append("        </cell>")
    lines += ["      </cells>", "    </topology>"]
    banks: dict[tuple[int, int], list[int]] = {}
    complete = not machine.masks_only
    for cpu in machine.cpus:
        if not cpu.online:
            continue
        for level, _kind, shared, cache_id, _size in cache_entries(machine, cpu, online):
            if level >= 3:
                banks[(level, cache_id)] = sorted(shared)
    if banks and complete:
        lines.append("    <cache>")
        for (level, bank_id), cpus in sorted(banks.items()):
            lines.append(f"      <bank id='{bank_id}' level='{level}' type='both' size='32' unit='MiB' "
                         f"cpus='{cpulist(cpus)}'/>")
        lines.append("    </cache>")
    lines += ["  </host>", "</capabilities>"]
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


def xeon_snc_nul() -> Machine:
    cpus = []
    for core in range(16):
        pair = (core, core + 16)
        node, package = core // 4, core // 8
        socket = tuple(c for c in range(32) if (c % 16) // 8 == package)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=node, package=package, core_id=core % 8, siblings=pair,
                                l2=pair, l3=socket, l2_id=core, l3_id=package))
    rows = [[10 if a == b else 11 if a // 2 == b // 2 else 21 for b in range(4)] for a in range(4)]
    nodes = [NodeSpec(n, 32 * GIB, 30 * GIB, tuple(rows[n]), {2048: (64, 64)}) for n in range(4)]
    return Machine("xeon-snc-nul", cpus, nodes, nul_padding=True)


def xeon_2s_masks() -> Machine:
    cpus = []
    for core in range(20):
        pair = (core, core + 20)
        package = core // 10
        socket = tuple(c for c in range(40) if (c % 20) // 10 == package)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=package, package=package, core_id=core % 10, siblings=pair,
                                l2=pair, l3=socket, l2_id=core, l3_id=package))
    nodes = [NodeSpec(0, 48 * GIB, 40 * GIB, (10, 20)), NodeSpec(1, 48 * GIB, 44 * GIB, (20, 10))]
    return Machine("xeon-2s-masks", cpus, nodes, masks_only=True, old_kernel=True)


def kvm_no_ids() -> Machine:
    cpus = []
    for core in range(4):
        pair = (2 * core, 2 * core + 1)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=0, package=0, core_id=core, siblings=pair,
                                l2=pair, l3=tuple(range(8)), l2_id=core, l3_id=0))
    nodes = [NodeSpec(0, 16 * GIB, 12 * GIB, (10,))]
    omitted = ("core_id", "physical_package_id", "core_siblings_list", "core_siblings", "package_cpus_list",
               "die_id", "die_cpus_list")
    return Machine("kvm-no-ids", cpus, nodes, omit_topology=omitted)


def empty_cpu0_online() -> Machine:
    cpus = []
    for core in range(4):
        pair = (core, core + 4)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=0, package=0, core_id=core, siblings=pair,
                                l2=pair, l3=tuple(range(8)), l2_id=core, l3_id=0))
    nodes = [NodeSpec(0, 16 * GIB, 15 * GIB, (10,))]
    return Machine("empty-cpu0-online", cpus, nodes, empty_online=(0,))


def cpu0_offline_node0() -> Machine:
    cpus = [CpuSpec(id=i, node=0, package=0, core_id=i, siblings=(i,), online=False) for i in range(4)]
    for core in range(4):
        pair = (4 + core, 8 + core)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=1, package=1, core_id=core, siblings=pair,
                                l2=pair, l3=tuple(range(4, 12)), l2_id=core, l3_id=1))
    nodes = [NodeSpec(0, 0, 0, (10, 20), online=False), NodeSpec(1, 32 * GIB, 28 * GIB, (20, 10))]
    return Machine("cpu0-offline-node0", cpus, nodes)


def s390x_books() -> Machine:
    cpus = []
    for core in range(16):
        socket = core // 2
        book, drawer = socket // 2, socket // 4
        threads = (2 * core, 2 * core + 1)
        for cpu_id in threads:
            cpus.append(CpuSpec(id=cpu_id, node=0, package=socket, core_id=core, siblings=threads,
                                book=book, drawer=drawer))
    nodes = [NodeSpec(0, 256 * GIB, 200 * GIB, (10,), {1024: (0, 0)})]
    return Machine("s390x-books", cpus, nodes, arch="s390x", old_kernel=True, package_id=-1,
                   private_caches=True)


def xeon_2s_cpumap() -> Machine:
    cpus = []
    for core in range(20):
        pair = (core, core + 20)
        package = core // 10
        socket = tuple(c for c in range(40) if (c % 20) // 10 == package)
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=package, package=package, core_id=core % 10, siblings=pair,
                                l2=pair, l3=socket, l2_id=core, l3_id=package))
    nodes = [NodeSpec(0, 64 * GIB, 60 * GIB, (10, 21)), NodeSpec(1, 64 * GIB, 62 * GIB, (21, 10))]
    return Machine("xeon-2s-cpumap", cpus, nodes, node_cpumap_only=True)


def arm_gpu_memory() -> Machine:
    everything = tuple(range(16))
    cpus = [CpuSpec(id=i, node=0, package=0, core_id=i, siblings=(i,), l2=(i,), l3=everything, l2_id=i,
                    l3_id=0, cluster_id=-1) for i in everything]
    nodes = [
        NodeSpec(0, 120 * GIB, 100 * GIB, (10, 40, 30), {2048: (0, 0), 524288: (0, 0)}),
        NodeSpec(1, 96 * GIB, 96 * GIB, (40, 10, 50)),
        NodeSpec(2, 256 * GIB, 256 * GIB, (30, 50, 10)),
    ]
    return Machine("arm-gpu-memory", cpus, nodes, arch="aarch64", omit_topology=("die_id", "die_cpus_list"))


def epyc_4die_llc() -> Machine:
    cpus = []
    for core in range(16):
        pair = (core, core + 16)
        die = core // 4
        ccd = tuple(range(4 * die, 4 * die + 4)) + tuple(range(16 + 4 * die, 20 + 4 * die))
        for cpu_id in pair:
            cpus.append(CpuSpec(id=cpu_id, node=0, package=0, die=die, core_id=core % 4, siblings=pair,
                                l2=pair, l3=ccd, l2_id=core, l3_id=die, cluster_id=0xFFFF))
    nodes = [NodeSpec(0, 256 * GIB, 250 * GIB, (10,), {2048: (256, 256), 1048576: (8, 8)})]
    return Machine("epyc-4die-llc", cpus, nodes)


def arm_clusters() -> Machine:
    cpus = []
    for core in range(32):
        node = core // 16
        node_cpus = tuple(range(16 * node, 16 * node + 16))
        cpus.append(CpuSpec(id=core, node=node, package=36, core_id=core, siblings=(core,), l2=(core,),
                            l3=node_cpus, l2_id=core, l3_id=node, cluster_id=256 * node + (core % 16) // 4 * 8))
    nodes = [NodeSpec(0, 64 * GIB, 60 * GIB, (10, 12)), NodeSpec(1, 64 * GIB, 63 * GIB, (12, 10))]
    return Machine("arm-clusters", cpus, nodes, arch="aarch64",
                   omit_topology=("die_id", "die_cpus_list"))


def ia64_montecito() -> Machine:
    cpus = []
    for core in range(4):
        threads = (2 * core, 2 * core + 1)
        for cpu_id in threads:
            cpus.append(CpuSpec(id=cpu_id, node=0, package=core // 2, core_id=core % 2, siblings=threads,
                                l2=threads, l3=threads, l2_id=core, l3_id=core))
    nodes = [NodeSpec(0, 32 * GIB, 30 * GIB, (10,))]
    return Machine("ia64-montecito", cpus, nodes, arch="ia64", masks_only=True, old_kernel=True)


MACHINES = (xeon_2s_sparse, power9_smt4, hybrid_adl, memory_only_node, amd_nps2, xeon_snc_nul, xeon_2s_masks,
            kvm_no_ids, empty_cpu0_online, cpu0_offline_node0, s390x_books, xeon_2s_cpumap, arm_gpu_memory,
            epyc_4die_llc, arm_clusters, ia64_montecito)


def build_all(out_dir: Path) -> dict[str, Path]:
    """Write every machine under OUT_DIR; returns name -> ROOT."""
    roots = {}
    for make in MACHINES:
        machine = make()
        roots[machine.name] = write_machine(machine, out_dir)
    return roots


def machines() -> dict[str, Machine]:
    return {machine.name: machine for machine in (make() for make in MACHINES)}


def write_capabilities(out_dir: Path = CAPS_DIR) -> list[Path]:
    """Write the capabilities fixtures (CAPS_FIXTURES) as OUT_DIR/<name>.xml."""
    out_dir.mkdir(parents=True, exist_ok=True)
    known = machines()
    written = []
    for name in CAPS_FIXTURES:
        path = out_dir / f"{name}.xml"
        path.write_text(libvirt_capabilities(known[name]))
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?", help="directory to write the sysfs trees into")
    parser.add_argument("--caps", action="store_true", help=f"rewrite the capabilities fixtures in {CAPS_DIR}")
    args = parser.parse_args()
    if not args.out_dir and not args.caps:
        parser.error("give OUT_DIR, --caps, or both")
    if args.out_dir:
        for name, root in build_all(args.out_dir).items():
            print(f"{name}: {root}")
    if args.caps:
        for path in write_capabilities():
            print(path)


if __name__ == "__main__":
    main()
