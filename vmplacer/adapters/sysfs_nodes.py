"""NUMA nodes from sysfs: memory, distances, hugepages and the CPUs each node lists.

What the kernel does and this reader relies on:
- every node the kernel registered has a `nodeN` directory, CPU-less memory
  nodes (CXL, HBM, GPU memory) included;
- a node lists its CPUs in `cpulist`, and in the hex mask `cpumap`, the only
  form some kernels offer;
- a `distance` row has one entry per node in id order — per online node on
  most kernels, but dumps of machines whose node 0 went offline with CPU 0
  still carry an entry for it, so a row is matched against the online nodes,
  then the node directories, then the possible nodes;
- a kernel built without NUMA has no `node` directory: one node holds
  everything, its memory from /proc/meminfo.
"""

from __future__ import annotations

import re
from pathlib import Path

from vmplacer.adapters.sysfs_files import SysfsError, SysfsFiles
from vmplacer.core.topology.host import HugepagePool, Node

_NODE_DIR = re.compile(r"^node(\d+)$")
_HUGEPAGE_DIR = re.compile(r"^hugepages-(\d+)kB$")
_MEMINFO_LINE = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?\s*$")


def node_ids(node_dir: Path) -> list[int]:
    if not node_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for e in node_dir.iterdir() if (m := _NODE_DIR.match(e.name)))


def read_nodes(files: SysfsFiles, node_dir: Path) -> tuple[dict[int, Node], dict[int, frozenset[int] | None]]:
    """Nodes with memory, distances and hugepages, and the CPUs each node lists (None: it does not say)."""
    ids = node_ids(node_dir)
    if not ids:
        total, free = _proc_meminfo(files, files.root / "proc" / "meminfo")
        return {0: Node(id=0, memory_kib=total, free_kib=free, distances={0: 10})}, {}
    orders = _distance_orders(files, node_dir, ids)
    nodes: dict[int, Node] = {}
    cpus: dict[int, frozenset[int] | None] = {}
    for node_id in ids:
        base = node_dir / f"node{node_id}"
        cpus[node_id] = files.cpus(base, ["cpulist"], ["cpumap"])
        if cpus[node_id] is None:
            files.warn("node-cpus", base / "cpulist",
                       "missing, and no cpumap either; its CPUs are found through their cpuN/nodeM links")
        meminfo = _node_meminfo(files, base / "meminfo")
        nodes[node_id] = Node(
            id=node_id,
            memory_kib=meminfo["MemTotal"],
            free_kib=min(meminfo.get("MemFree", meminfo["MemTotal"]), meminfo["MemTotal"]),
            distances=_node_distances(files, base / "distance", orders, set(ids)),
            hugepages=_node_hugepages(files, base / "hugepages"),
        )
    return nodes, cpus


def _distance_orders(files: SysfsFiles, node_dir: Path, ids: list[int]) -> list[list[int]]:
    """Node orders a distance row may follow, most likely first."""
    orders = []
    for list_name in ("online", None, "possible"):
        order = ids if list_name is None else sorted(files.cpulist(node_dir / list_name) or ())
        if order and order not in orders:
            orders.append(order)
    return orders


def _node_distances(files: SysfsFiles, path: Path, orders: list[list[int]], known: set[int]) -> dict[int, int]:
    text = files.text(path)
    if text is None:
        files.warn("distance", path, "missing; distances taken as 10 local and 20 remote")
        return {}
    try:
        values = [int(v) for v in text.split()]
    except ValueError:
        raise SysfsError(f"{path}: expected integers, found {text!r}") from None
    for order in orders:
        if len(order) == len(values):
            return {node: value for node, value in zip(order, values, strict=True) if node in known}
    online = orders[0] if orders else []
    raise SysfsError(f"{path}: {len(values)} distances for {len(online)} online nodes {online}, "
                     f"found {text!r} (no other node list has that length either)")


def _node_meminfo(files: SysfsFiles, path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in files.required(path).splitlines():
        match = _MEMINFO_LINE.match(line)
        if match:
            values[match.group(1)] = int(match.group(2))
    if "MemTotal" not in values:
        raise SysfsError(f"{path}: no 'Node N MemTotal: ... kB' line")
    return values


def _proc_meminfo(files: SysfsFiles, path: Path) -> tuple[int, int]:
    text = files.text(path)
    if text is None:
        files.warn("proc-meminfo", path, "missing (and no NUMA nodes in sysfs); memory taken as 0")
        return 0, 0
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[key.strip()] = int(fields[0])
    total = values.get("MemTotal", 0)
    return total, min(values.get("MemAvailable", values.get("MemFree", total)), total)


def _node_hugepages(files: SysfsFiles, path: Path) -> tuple[HugepagePool, ...]:
    if not path.is_dir():
        return ()
    pools = []
    for entry in path.iterdir():
        match = _HUGEPAGE_DIR.match(entry.name)
        if not match:
            continue
        total = files.integer(entry / "nr_hugepages")
        free = files.integer(entry / "free_hugepages")
        if total is None or free is None:
            missing = entry / ("nr_hugepages" if total is None else "free_hugepages")
            state = files.absence(missing)
            files.warn(f"hugepages-{state}", missing, f"{state}; that hugepage pool is left out")
            continue
        pools.append(HugepagePool(size_kib=int(match.group(1)), total=total, free=free))
    return tuple(sorted(pools, key=lambda p: p.size_kib))
