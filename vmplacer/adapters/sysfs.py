"""Read a host's topology from a Linux sysfs tree.

ROOT is a directory containing `sys/devices/system/...` — "/" on a live
machine, a dump of another machine in tests — so the reader works the same on
recorded machines as on the one it runs on. It only collects facts; numbering
packages, dies, clusters, cores and cache groups is `assemble_topology`'s
job, shared with the capabilities reader so both agree on one machine.

What the kernel does and this reader relies on (Documentation/ABI/stable/
sysfs-devices-system-cpu, admin-guide/cputopology.rst):
- an offline CPU has no `topology/` and no `cache/` directory; it is listed as
  offline, in the node whose CPU list names it, else the node its `cpuN/nodeM`
  link points to, else the lowest node;
- `cpuN/online` exists only for CPUs that can go offline (cpu0 often has
  none); an empty one says nothing and the `online` list decides;
- topology ids default to -1 where an architecture has no such level
  (`physical_package_id` on s390x and some hypervisors, `die_id`,
  `cluster_id`; x86 prints 65535 for an unknown cluster); `die_id`,
  `cluster_id`, `core_cpus*` and `package_cpus*` are missing on older
  kernels. Without package ids, packages are the groups of
  `package_cpus_list` / `core_siblings_list`, else one per NUMA node;
  without core ids, the SMT sibling lists form the cores;
- CPU sets come as lists (`*_list`, `cpulist`) or, on older kernels and some
  architectures only, as hex masks (`shared_cpu_map`, `thread_siblings`,
  `core_siblings`, `cpumap`);
- `cache/indexN` of an online CPU: `level`, `type`, `size`, `shared_cpu_list` or
  `shared_cpu_map`; s390x lists only the caches private to one CPU;
- hybrid Intel hosts list their P and E cores in `/sys/devices/cpu_core/cpus`
  and `/sys/devices/cpu_atom/cpus`.
Books and drawers (s390x) are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

from vmplacer.adapters.sysfs_files import SysfsError, SysfsFiles
from vmplacer.adapters.sysfs_nodes import read_nodes
from vmplacer.core.topology.assemble import CacheFacts, CpuFacts, TopologyError, assemble_topology
from vmplacer.core.topology.host import HostTopology

__all__ = ["SysfsError", "read_sysfs"]

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
HYBRID_KINDS = {"cpu_core": "performance", "cpu_atom": "efficiency"}
SIBLING_LISTS = ("core_cpus_list", "thread_siblings_list")
SIBLING_MASKS = ("core_cpus", "thread_siblings")
PACKAGE_LISTS = ("package_cpus_list", "core_siblings_list")
PACKAGE_MASKS = ("package_cpus", "core_siblings")


def read_sysfs(root: str | Path, name: str = "host") -> HostTopology:
    """Read NUMA nodes, CPUs, SMT siblings, dies, clusters, caches and hugepages under ROOT.

    Missing optional files become the topology's `warnings`; anything that
    leaves the topology unknowable raises one `SysfsError` naming the file.
    """
    root = Path(root)
    files = SysfsFiles(root)
    system = root / "sys" / "devices" / "system"
    cpu_dir = system / "cpu"
    if not cpu_dir.is_dir():
        raise SysfsError(f"{cpu_dir}: no such directory (ROOT must contain sys/devices/system/cpu)")

    present = _present_cpus(files, cpu_dir)
    online = _online_cpus(files, cpu_dir, present)
    nodes, node_cpus = read_nodes(files, system / "node")
    kinds = _hybrid_kinds(files, root / "sys" / "devices")
    node_of = _cpu_nodes(files, cpu_dir, present, node_cpus, set(nodes))

    facts: list[CpuFacts] = []
    caches: set[CacheFacts] = set()
    for cpu in sorted(present):
        base = cpu_dir / f"cpu{cpu}"
        if cpu not in online:
            facts.append(CpuFacts(id=cpu, node=node_of[cpu], online=False, kind=kinds.get(cpu)))
            continue
        facts.append(_cpu_facts(files, base, cpu, node_of[cpu], kinds.get(cpu)))
        caches.update(_read_caches(files, base / "cache"))
    _warn_about_packages(files, cpu_dir, [f for f in facts if f.online])

    isolated = files.cpulist(cpu_dir / "isolated") or frozenset()
    try:
        return assemble_topology(facts, nodes, sorted(caches, key=lambda c: (c.level, min(c.cpus))),
                                 isolated=isolated, name=name, warnings=files.warnings())
    except TopologyError as exc:
        raise SysfsError(f"{root}: {exc}") from None


# ----- which CPUs exist, are online, and where ---------------------------------------------

def _present_cpus(files: SysfsFiles, cpu_dir: Path) -> frozenset[int]:
    """The `present` list, else the cpuN directories (`possible` also names empty sockets)."""
    present = files.cpulist(cpu_dir / "present")
    if present:
        return present
    found = frozenset(int(m.group(1)) for e in cpu_dir.iterdir() if (m := _CPU_DIR.match(e.name)))
    if not found:
        raise SysfsError(f"{cpu_dir}: no CPU: neither a 'present' list nor cpuN directories")
    return found


def _online_cpus(files: SysfsFiles, cpu_dir: Path, present: frozenset[int]) -> frozenset[int]:
    """`online` list, corrected by each CPU's own `online` flag (cpu0 often has none)."""
    listed = files.cpulist(cpu_dir / "online")
    online = set(present if listed is None else listed)
    for cpu in sorted(present):
        flag_file = cpu_dir / f"cpu{cpu}" / "online"
        flag = files.text(flag_file)
        if flag is None:
            continue
        if flag == "":
            files.warn("online-flag", flag_file, "empty; the online list decides")
        elif flag == "1":
            online.add(cpu)
        elif flag == "0":
            online.discard(cpu)
        else:
            raise SysfsError(f"{flag_file}: expected 0 or 1, found {flag!r}")
    online &= present
    if not online:
        raise SysfsError(f"{cpu_dir / 'online'}: no online CPU among the present ones {sorted(present)}")
    return frozenset(online)


def _cpu_nodes(files: SysfsFiles, cpu_dir: Path, present: frozenset[int],
               node_cpus: dict[int, frozenset[int] | None], nodes: set[int]) -> dict[int, int]:
    """Node of every present CPU: the first node listing it, else its nodeM link, else the lowest node."""
    node_of: dict[int, int] = {}
    for node_id, cpus in sorted(node_cpus.items()):
        for cpu in cpus or ():
            node_of.setdefault(cpu, node_id)
    for cpu in sorted(present - set(node_of)):
        linked = _linked_node(cpu_dir / f"cpu{cpu}")
        if linked is None or linked not in nodes:
            linked = min(nodes)
            if len(nodes) > 1:
                files.warn("cpu-node", cpu_dir / f"cpu{cpu}",
                           f"no node lists it and it has no nodeM link; put in node {linked}")
        node_of[cpu] = linked
    return node_of


def _linked_node(cpu_base: Path) -> int | None:
    """The node of a CPU from its `cpuN/nodeM` link (present even when offline)."""
    if not cpu_base.is_dir():
        return None
    for entry in sorted(cpu_base.iterdir()):
        match = _NODE_DIR.match(entry.name)
        if match:
            return int(match.group(1))
    return None


# ----- one online CPU ----------------------------------------------------------------------

def _cpu_facts(files: SysfsFiles, base: Path, cpu: int, node: int, kind: str | None) -> CpuFacts:
    topo = base / "topology"
    if not topo.is_dir():
        files.warn("topology-dir", topo, "missing; the CPU is taken as a core of its own")
        return CpuFacts(id=cpu, node=node, online=True, kind=kind)
    siblings = files.cpus(topo, SIBLING_LISTS, SIBLING_MASKS, nonempty=True)
    core_id = files.integer(topo / "core_id")
    if core_id is None:
        state = files.absence(topo / "core_id")
        files.warn(f"core_id-{state}", topo / "core_id",
                   f"{state}; cores taken from the SMT sibling lists" if siblings is not None
                   else f"{state}, and no SMT sibling list: the CPU is taken as a core of its own")
    die = files.integer(topo / "die_id")
    return CpuFacts(
        id=cpu,
        node=node,
        online=True,
        package=files.integer(topo / "physical_package_id"),
        die=max(die or 0, 0),
        core_id=core_id if core_id is None or core_id >= 0 else None,
        siblings=siblings,
        kind=kind,
        cluster=files.integer(topo / "cluster_id"),
        package_cpus=files.cpus(topo, PACKAGE_LISTS, PACKAGE_MASKS, nonempty=True),
    )


def _warn_about_packages(files: SysfsFiles, cpu_dir: Path, online: list[CpuFacts]) -> None:
    """Say how packages were found when some online CPU has no package id (-1 or no file)."""
    missing = [f for f in online if f.package is None or f.package < 0]
    if not missing:
        return
    if len(missing) < len(online):
        consequence = "taken from a CPU of the same package that reports one"
    elif all(f.package_cpus for f in online):
        consequence = "packages taken from package_cpus_list / core_siblings_list"
    else:
        consequence = "no package CPU lists either: one package per NUMA node assumed"
    for fact in missing:
        path = cpu_dir / f"cpu{fact.id}" / "topology" / "physical_package_id"
        state = files.absence(path) if fact.package is None else f"reads {fact.package}"
        files.warn(f"package-{state}", path, f"{state}; {consequence}")


def _read_caches(files: SysfsFiles, cache_dir: Path) -> list[CacheFacts]:
    """Data and unified caches of level 2 and up (L1 is per core anyway)."""
    if not cache_dir.is_dir():
        files.warn("cache-dir", cache_dir, "missing; such CPUs get one L2 per core and one LLC per die")
        return []
    found = []
    for index in sorted(cache_dir.glob("index*")):
        level = files.integer(index / "level")
        if level is None:
            state = files.absence(index / "level")
            files.warn(f"cache-level-{state}", index / "level", f"{state}; that cache is left out")
            continue
        kind = files.text(index / "type")
        if not kind:
            state = files.absence(index / "type")
            files.warn(f"cache-type-{state}", index / "type", f"{state}; the cache is taken as unified")
        if level < 2 or kind == "Instruction":
            continue
        cpus = files.cpus(index, ["shared_cpu_list"], ["shared_cpu_map"])
        if cpus is None:
            files.warn("cache-cpus", index / "shared_cpu_list",
                       "missing, and no shared_cpu_map either; that cache is left out")
        elif cpus:
            found.append(CacheFacts(level=level, cpus=cpus, source=str(index),
                                    size_kib=_cache_size_kib(files.text(index / "size"))))
    return found


_CACHE_SIZE = re.compile(r"^(\d+)([KMG]?)$")
_SIZE_UNIT_BYTES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # bytes per unit


def _cache_size_kib(text: str | None) -> int | None:
    """KiB from a `cache/indexN/size` ('32768K', '2M'); None when missing or unreadable: the size
    is shown to operators only, so an odd spelling costs the size, not the host."""
    found = _CACHE_SIZE.match((text or "").strip().upper())
    if not found:
        return None
    return int(found.group(1)) * _SIZE_UNIT_BYTES[found.group(2)] // 1024


def _hybrid_kinds(files: SysfsFiles, devices: Path) -> dict[int, str]:
    kinds: dict[int, str] = {}
    for pmu, kind in HYBRID_KINDS.items():
        for cpu in files.cpulist(devices / pmu / "cpus") or ():
            kinds[cpu] = kind
    return kinds
