#!/usr/bin/env python3
"""Generate examples/hosts/*.xml (and the built-in example host vmplacer/data/example-host.xml):
libvirt capabilities of realistic hosts.

The files are what `virsh capabilities` prints for these machines, trimmed to
the <host> part vmplacer reads (NUMA cells, CPUs, hugepages, cache banks). They
let operators and tests plan for hosts they do not have:
`vmplacer topology --caps examples/hosts/numa16-256c.xml`.

Run from the repository root: `python scripts/gen_example_hosts.py` (rewrites
the files; the output is committed next to this script's source).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "examples" / "hosts"
BUILTIN_FILE = Path(__file__).resolve().parent.parent / "vmplacer" / "data" / "example-host.xml"
GIB_KIB = 1024 * 1024


@dataclass
class HostCpu:
    id: int
    socket: int
    die: int
    core: int  # hardware core id: repeats per socket (and per die on some hosts)
    siblings: tuple[int, ...]


@dataclass
class Cell:
    id: int
    memory_kib: int
    distances: dict[int, int]
    cpus: list[HostCpu]
    hugepages: dict[int, int] = field(default_factory=dict)  # size KiB -> count


@dataclass
class Bank:
    id: int
    level: int
    size: int
    unit: str
    cpus: tuple[int, ...]


@dataclass
class Host:
    file: str
    comment: str
    uuid: str
    model: str
    vendor: str
    sockets: int
    dies: int
    cores: int
    threads: int
    cells: list[Cell]
    banks: list[Bank]


def cpuset(cpus: tuple[int, ...] | list[int]) -> str:
    ordered = sorted(set(cpus))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def render(host: Host) -> str:
    page_sizes = [4, 2048, 1048576]
    out = [f"<!-- {line} -->" for line in host.comment.strip().splitlines()]
    out += [
        "<capabilities>",
        "",
        "  <host>",
        f"    <uuid>{host.uuid}</uuid>",
        "    <cpu>",
        "      <arch>x86_64</arch>",
        f"      <model>{host.model}</model>",
        f"      <vendor>{host.vendor}</vendor>",
        f"      <topology sockets='{host.sockets}' dies='{host.dies}' cores='{host.cores}' "
        f"threads='{host.threads}'/>",
    ]
    out += [f"      <pages unit='KiB' size='{size}'/>" for size in page_sizes]
    out += [
        "    </cpu>",
        "    <power_management/>",
        "    <iommu support='yes'/>",
        "    <migration_features>",
        "      <live/>",
        "      <uri_transports>",
        "        <uri_transport>tcp</uri_transport>",
        "        <uri_transport>rdma</uri_transport>",
        "      </uri_transports>",
        "    </migration_features>",
        "    <topology>",
        f"      <cells num='{len(host.cells)}'>",
    ]
    for cell in host.cells:
        huge_kib = sum(size * count for size, count in cell.hugepages.items())
        out += [
            f"        <cell id='{cell.id}'>",
            f"          <memory unit='KiB'>{cell.memory_kib}</memory>",
            f"          <pages unit='KiB' size='4'>{(cell.memory_kib - huge_kib) // 4}</pages>",
        ]
        out += [
            f"          <pages unit='KiB' size='{size}'>{cell.hugepages.get(size, 0)}</pages>"
            for size in page_sizes[1:]
        ]
        out.append("          <distances>")
        out += [
            f"            <sibling id='{other}' value='{value}'/>"
            for other, value in sorted(cell.distances.items())
        ]
        out.append("          </distances>")
        out.append(f"          <cpus num='{len(cell.cpus)}'>")
        out += [
            f"            <cpu id='{c.id}' socket_id='{c.socket}' die_id='{c.die}' core_id='{c.core}' "
            f"siblings='{cpuset(c.siblings)}'/>"
            for c in sorted(cell.cpus, key=lambda c: c.id)
        ]
        out += ["          </cpus>", "        </cell>"]
    out += ["      </cells>", "    </topology>", "    <cache>"]
    out += [
        f"      <bank id='{b.id}' level='{b.level}' type='both' size='{b.size}' unit='{b.unit}' "
        f"cpus='{cpuset(b.cpus)}'/>"
        for b in sorted(host.banks, key=lambda b: (b.level, b.id))
    ]
    out += [
        "    </cache>",
        "    <secmodel>",
        "      <model>none</model>",
        "      <doi>0</doi>",
        "    </secmodel>",
        "  </host>",
        "",
        "</capabilities>",
    ]
    return "\n".join(out) + "\n"


# ----- the hosts ------------------------------------------------------------------------

def xeon_2s_56c_smt2() -> Host:
    """2 x Xeon Platinum 8280: 28 cores x 2 threads per socket, one NUMA node per socket."""
    hw_core_ids = [i for block in range(4) for i in range(block * 8, block * 8 + 7)]  # 0-6, 8-14, ...
    cells, banks = [], []
    for socket in range(2):
        cpus = []
        for i, core_id in enumerate(hw_core_ids):
            pair = (socket * 28 + i, socket * 28 + i + 56)
            cpus += [HostCpu(cpu, socket, 0, core_id, pair) for cpu in pair]
        cells.append(
            Cell(socket, 192 * GIB_KIB, {0: 10 if socket == 0 else 21, 1: 21 if socket == 0 else 10},
                 cpus, {2048: 8192, 1048576: 32 if socket == 0 else 16})
        )
        banks.append(Bank(socket, 3, 39424, "KiB", tuple(c.id for c in cpus)))
    return Host(
        "xeon-2s-56c-smt2.xml",
        "2 x Intel Xeon Platinum 8280 (28 cores, HT): 112 pCPUs, 2 NUMA nodes, siblings n / n+56",
        "5a1c2f0e-8b3d-4e6a-9f27-0c4d1e2b3a01",
        "Cascadelake-Server-noTSX", "Intel", 2, 1, 28, 2, cells, banks,
    )


def opteron6378_4node() -> Host:
    """2 x Opteron 6378: two dies per package, each die its own NUMA node of 8 cores.

    Piledriver modules pair cores on one L2 (2 MiB) and front end; no SMT.
    Hardware core ids restart at 0 on every die.
    """
    cells, banks = [], []
    for node in range(4):
        socket, die = divmod(node, 2)
        first = node * 8
        cpus = [HostCpu(first + i, socket, die, i, (first + i,)) for i in range(8)]
        distances = {other: 10 if other == node else 16 for other in range(4)}
        cells.append(Cell(node, 64 * GIB_KIB, distances, cpus, {2048: 2048}))
        for module in range(4):
            cpu = first + 2 * module
            banks.append(Bank(cpu // 2, 2, 2048, "KiB", (cpu, cpu + 1)))
        banks.append(Bank(node, 3, 6, "MiB", tuple(range(first, first + 8))))
    return Host(
        "opteron6378-4node.xml",
        "2 x AMD Opteron 6378 (Piledriver, 16 cores each): 32 pCPUs, 4 NUMA nodes x 8 cores, no SMT,\n"
        "L2 shared by the 2 cores of a module, 64 GiB per node, equal remote distances",
        "0f3e6d2a-6378-4c1b-8a55-2b7c9d4e5f02",
        "Opteron_G5", "AMD", 2, 2, 8, 1, cells, banks,
    )


def xeon_e3_4c8t() -> Host:
    """Xeon E3-1240 v5: one socket, 4 cores x 2 threads, siblings n / n+4."""
    cpus = []
    for core in range(4):
        pair = (core, core + 4)
        cpus += [HostCpu(cpu, 0, 0, core, pair) for cpu in pair]
    cells = [Cell(0, 32 * GIB_KIB, {0: 10}, cpus, {2048: 1024})]
    banks = [Bank(0, 3, 8, "MiB", tuple(range(8)))]
    return Host(
        "xeon-e3-4c8t.xml",
        "Intel Xeon E3-1240 v5: 1 socket, 4 cores, 8 threads (siblings n / n+4), 1 NUMA node",
        "7c2b9e14-1240-45d3-b6a8-3e5f0a1d2c03",
        "Skylake-Client-IBRS", "Intel", 1, 1, 4, 2, cells, banks,
    )


def numa16_256c() -> Host:
    """8 sockets x 2 NUMA nodes (sub-NUMA clustering) x 16 cores x 2 threads = 512 pCPUs.

    Distances: 10 local, 12 to the other node of the same socket, 32 to other sockets.
    The LLC is split per node (SNC). Siblings n / n+256.
    """
    cells, banks = [], []
    for node in range(16):
        socket = node // 2
        cpus = []
        for i in range(16):
            core = node * 16 + i
            pair = (core, core + 256)
            cpus += [HostCpu(cpu, socket, 0, (node % 2) * 16 + i, pair) for cpu in pair]
        distances = {
            other: 10 if other == node else 12 if other // 2 == socket else 32 for other in range(16)
        }
        hugepages = {2048: 4096, 1048576: 16 if node % 4 == 0 else 0}
        cells.append(Cell(node, 64 * GIB_KIB, distances, cpus, hugepages))
        banks.append(Bank(node, 3, 30, "MiB", tuple(c.id for c in cpus)))
    return Host(
        "numa16-256c.xml",
        "8 sockets x 2 NUMA nodes x 16 cores x 2 threads = 256 cores, 512 pCPUs, 16 NUMA nodes;\n"
        "distances 10 (local) / 12 (same socket) / 32 (other socket), LLC per node",
        "c0ffee16-0256-4a7b-9c3d-4e5f6a7b8c04",
        "SapphireRapids", "Intel", 8, 1, 32, 2, cells, banks,
    )


def builtin_example() -> Host:
    """The host vmplacer plans on with no config (domains go to libvirt's test driver):
    2 x Xeon Gold 6226R, 16 cores x 2 threads per socket, 96 GiB per socket; siblings n / n+32."""
    cells, banks = [], []
    for socket in range(2):
        cpus = []
        for core in range(16):
            pair = (socket * 16 + core, socket * 16 + core + 32)
            cpus += [HostCpu(cpu, socket, 0, core, pair) for cpu in pair]
        cells.append(Cell(socket, 96 * GIB_KIB, {0: 10 if socket == 0 else 21, 1: 21 if socket == 0 else 10},
                          cpus, {2048: 2048, 1048576: 16}))
        banks.append(Bank(socket, 3, 22, "MiB", tuple(c.id for c in cpus)))
    return Host(
        "example-host.xml",
        "vmplacer's built-in example host (no config file): 2 x Intel Xeon Gold 6226R (16 cores, HT),\n"
        "64 pCPUs, 2 NUMA nodes of 96 GiB, siblings n / n+32; 4 GiB of 2 MiB and 16 GiB of 1 GiB pages per node",
        "e8a3c6d1-6226-4f0b-a1c2-5d7e9f0a1b05",
        "Cascadelake-Server-noTSX", "Intel", 2, 1, 16, 2, cells, banks,
    )


HOSTS = (xeon_2s_56c_smt2, opteron6378_4node, xeon_e3_4c8t, numa16_256c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output directory (default {OUT_DIR})")
    out_dir = parser.parse_args().out
    out_dir.mkdir(parents=True, exist_ok=True)
    for make in HOSTS:
        host = make()
        (out_dir / host.file).write_text(render(host))
        print(out_dir / host.file)
    BUILTIN_FILE.parent.mkdir(exist_ok=True)
    BUILTIN_FILE.write_text(render(builtin_example()))
    print(BUILTIN_FILE)


if __name__ == "__main__":
    main()
