"""Read a host's topology from a Linux sysfs tree.

ROOT is a directory containing `sys/devices/system/...` — "/" on a live
machine, a fixture tree in tests — so the reader works the same on recorded
machines as on the one it runs on. It only collects facts; numbering cores
and cache groups is `assemble_topology`'s job, shared with the capabilities
reader so both agree on one machine.

What the kernel does and this reader relies on:
- an offline CPU has no `topology/` and no `cache/` directory; it is listed as
  offline, in the node whose `cpulist` names it, else the node its
  `cpuN/nodeM` link points to, else the lowest node;
- `nodeN/distance` lists distances to the online nodes in id order;
- hybrid Intel hosts list their P and E cores in `/sys/devices/cpu_core/cpus`
  and `/sys/devices/cpu_atom/cpus`;
- CPUs in `possible` but not `present` are empty sockets and are not listed.
"""

from __future__ import annotations

import re
from pathlib import Path

from vmplacer.core.cpuset import CpusetError, parse_cpuset
from vmplacer.core.topology import (
    CacheFacts,
    CpuFacts,
    HostTopology,
    HugepagePool,
    Node,
    TopologyError,
    assemble_topology,
)

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_HUGEPAGE_DIR = re.compile(r"^hugepages-(\d+)kB$")
_MEMINFO_LINE = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?\s*$")
HYBRID_KINDS = {"cpu_core": "performance", "cpu_atom": "efficiency"}


class SysfsError(ValueError):
    """A sysfs tree that cannot be read as a topology; the message names the file."""


def read_sysfs(root: str | Path, name: str = "host") -> HostTopology:
    """Read NUMA nodes, CPUs, SMT siblings, caches and hugepages under ROOT."""
    root = Path(root)
    system = root / "sys" / "devices" / "system"
    cpu_dir = system / "cpu"
    if not cpu_dir.is_dir():
        raise SysfsError(f"{cpu_dir}: no such directory (ROOT must contain sys/devices/system/cpu)")

    present = _present_cpus(cpu_dir)
    online = _online_cpus(cpu_dir, present)
    nodes, node_cpus = _read_nodes(root, system / "node")
    kinds = _hybrid_kinds(root / "sys" / "devices")

    node_of: dict[int, int] = {}
    for node_id, cpus in node_cpus.items():
        for cpu in cpus:
            node_of.setdefault(cpu, node_id)

    facts: list[CpuFacts] = []
    caches: set[CacheFacts] = set()
    for cpu in sorted(present):
        base = cpu_dir / f"cpu{cpu}"
        node = node_of.get(cpu)
        if node is None:
            node = _linked_node(base)
        if node is None or node not in nodes:
            node = min(nodes)
        is_online = cpu in online
        topo_dir = base / "topology"
        if is_online and topo_dir.is_dir():
            siblings_file = topo_dir / "core_cpus_list"
            if not siblings_file.exists():
                siblings_file = topo_dir / "thread_siblings_list"
            siblings = _read_cpuset(siblings_file) if siblings_file.exists() else None
            facts.append(
                CpuFacts(
                    id=cpu,
                    node=node,
                    online=True,
                    package=_read_int(topo_dir / "physical_package_id"),
                    die=_read_int(topo_dir / "die_id") if (topo_dir / "die_id").exists() else 0,
                    core_id=_read_int(topo_dir / "core_id"),
                    siblings=siblings,
                    kind=kinds.get(cpu),
                )
            )
            caches.update(_read_caches(base / "cache"))
        else:
            facts.append(CpuFacts(id=cpu, node=node, online=is_online, kind=kinds.get(cpu)))

    isolated_file = cpu_dir / "isolated"
    isolated = _read_cpuset(isolated_file) if isolated_file.exists() else frozenset()
    try:
        return assemble_topology(facts, nodes, sorted(caches, key=lambda c: (c.level, min(c.cpus))),
                                 isolated=isolated, name=name)
    except TopologyError as exc:
        raise SysfsError(f"{root}: {exc}") from None


# ----- CPUs -------------------------------------------------------------------------------

def _present_cpus(cpu_dir: Path) -> frozenset[int]:
    for list_name in ("present", "possible"):
        if (cpu_dir / list_name).exists():
            return _read_cpuset(cpu_dir / list_name)
    return frozenset(
        int(m.group(1)) for entry in cpu_dir.iterdir() if (m := _CPU_DIR.match(entry.name))
    )


def _online_cpus(cpu_dir: Path, present: frozenset[int]) -> frozenset[int]:
    """`online` list, corrected by each CPU's own `online` flag (cpu0 often has none)."""
    online = set(_read_cpuset(cpu_dir / "online")) if (cpu_dir / "online").exists() else set(present)
    for cpu in present:
        flag_file = cpu_dir / f"cpu{cpu}" / "online"
        if flag_file.exists():
            flag = _read_int(flag_file)
            if flag == 1:
                online.add(cpu)
            elif flag == 0:
                online.discard(cpu)
            else:
                raise SysfsError(f"{flag_file}: expected 0 or 1, found {flag}")
    return frozenset(online & present)


def _linked_node(cpu_base: Path) -> int | None:
    """The node of a CPU from its `cpuN/nodeM` link (present even when offline)."""
    if not cpu_base.is_dir():
        return None
    for entry in sorted(cpu_base.iterdir()):
        match = _NODE_DIR.match(entry.name)
        if match:
            return int(match.group(1))
    return None


def _read_caches(cache_dir: Path) -> list[CacheFacts]:
    """Data and unified caches of level 2 and up (L1 is per core anyway)."""
    if not cache_dir.is_dir():
        return []
    found = []
    for index in sorted(cache_dir.glob("index*")):
        level = _read_int(index / "level")
        kind = _read(index / "type").strip()
        if level < 2 or kind == "Instruction":
            continue
        cpus = _read_cpuset(index / "shared_cpu_list")
        if cpus:
            found.append(CacheFacts(level=level, cpus=cpus))
    return found


def _hybrid_kinds(devices: Path) -> dict[int, str]:
    kinds: dict[int, str] = {}
    for pmu, kind in HYBRID_KINDS.items():
        cpus_file = devices / pmu / "cpus"
        if cpus_file.exists():
            for cpu in _read_cpuset(cpus_file):
                kinds[cpu] = kind
    return kinds


# ----- NUMA nodes -----------------------------------------------------------------------

def _read_nodes(root: Path, node_dir: Path) -> tuple[dict[int, Node], dict[int, frozenset[int]]]:
    """Nodes with memory, distances and hugepages, and the CPUs each node lists."""
    ids = (
        sorted(int(m.group(1)) for e in node_dir.iterdir() if (m := _NODE_DIR.match(e.name)))
        if node_dir.is_dir()
        else []
    )
    if not ids:
        # A kernel built without NUMA: one node holding everything.
        total, free = _proc_meminfo(root / "proc" / "meminfo")
        return {0: Node(id=0, memory_kib=total, free_kib=free, distances={0: 10})}, {}
    online_file = node_dir / "online"
    distance_order = sorted(_read_cpuset(online_file)) if online_file.exists() else ids
    nodes: dict[int, Node] = {}
    cpus: dict[int, frozenset[int]] = {}
    for node_id in ids:
        base = node_dir / f"node{node_id}"
        cpulist = base / "cpulist"
        cpus[node_id] = _read_cpuset(cpulist) if cpulist.exists() else frozenset()
        meminfo = _node_meminfo(base / "meminfo")
        nodes[node_id] = Node(
            id=node_id,
            memory_kib=meminfo["MemTotal"],
            free_kib=meminfo.get("MemFree", meminfo["MemTotal"]),
            distances=_node_distances(base / "distance", distance_order),
            hugepages=_node_hugepages(base / "hugepages"),
        )
    return nodes, cpus


def _node_meminfo(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in _read(path).splitlines():
        match = _MEMINFO_LINE.match(line)
        if match:
            values[match.group(1)] = int(match.group(2))
    if "MemTotal" not in values:
        raise SysfsError(f"{path}: no 'Node N MemTotal: ... kB' line")
    return values


def _proc_meminfo(path: Path) -> tuple[int, int]:
    if not path.exists():
        return 0, 0
    values = {}
    for line in _read(path).splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0])
    total = values.get("MemTotal", 0)
    return total, values.get("MemAvailable", values.get("MemFree", total))


def _node_distances(path: Path, order: list[int]) -> dict[int, int]:
    if not path.exists():
        return {}
    text = _read(path).split()
    try:
        values = [int(v) for v in text]
    except ValueError:
        raise SysfsError(f"{path}: expected integers, found {' '.join(text)!r}") from None
    if len(values) != len(order):
        raise SysfsError(
            f"{path}: {len(values)} distances for {len(order)} online nodes {order}"
        )
    return dict(zip(order, values, strict=True))


def _node_hugepages(path: Path) -> tuple[HugepagePool, ...]:
    if not path.is_dir():
        return ()
    pools = []
    for entry in path.iterdir():
        match = _HUGEPAGE_DIR.match(entry.name)
        if match:
            pools.append(
                HugepagePool(
                    size_kib=int(match.group(1)),
                    total=_read_int(entry / "nr_hugepages"),
                    free=_read_int(entry / "free_hugepages"),
                )
            )
    return tuple(sorted(pools, key=lambda p: p.size_kib))


# ----- files ------------------------------------------------------------------------------

def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise SysfsError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    try:
        return int(text)
    except ValueError:
        raise SysfsError(f"{path}: expected an integer, found {text!r}") from None


def _read_cpuset(path: Path) -> frozenset[int]:
    try:
        return parse_cpuset(_read(path))
    except CpusetError as exc:
        raise SysfsError(f"{path}: {exc}") from None
