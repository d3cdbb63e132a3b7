"""One value model of a host's CPU and memory topology.

Readers (libvirt capabilities, sysfs) build it; the allocator, the interference
model and the simulator only query it. Immutable: a what-if change (reserving
CPUs, taking memory) returns a new object, so policies can explore freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any


class DistanceClass(str, Enum):
    """How closely two pCPUs share hardware, from closest to farthest.

    `same-cpu` is one pCPU time-shared; the other five are the classes the
    interference model carries (docs/research/method.md §3).
    """

    SAME_CPU = "same-cpu"
    SAME_CORE = "same-core"
    SAME_L2 = "same-l2"
    SAME_LLC = "same-llc"
    SAME_NODE = "same-node"
    REMOTE_NODE = "remote-node"

    @property
    def rank(self) -> int:
        return _DISTANCE_ORDER.index(self)


_DISTANCE_ORDER = list(DistanceClass)

# Classes a pair of *different* pCPUs can be in, used by models and data files.
NEIGHBOUR_CLASSES: tuple[DistanceClass, ...] = tuple(_DISTANCE_ORDER[1:])


@dataclass(frozen=True)
class Cpu:
    """One logical CPU (an SMT thread).

    Levels from the package down: package → die → (cluster) → core → thread.
    `die`, `core` and `cluster` are global indexes (unique across the host),
    not the hardware ids, which repeat per package.
    """

    id: int
    node: int
    package: int = 0
    die: int = 0  # global die index; one die per package when the host reports none
    core: int = 0  # global core index (unique across packages and dies)
    l2: int | None = None  # L2 group id; None when the host does not say
    llc: int | None = None  # last-level-cache group id
    online: bool = True
    kind: str | None = None  # hybrid hosts: "performance" / "efficiency"
    cluster: int | None = None  # cores sharing an L2/bus (ARM, hybrid E-cores); None: no such level


@dataclass(frozen=True)
class HugepagePool:
    size_kib: int
    total: int
    free: int


@dataclass(frozen=True)
class Node:
    """One NUMA node (cell). A node may hold memory and no CPUs."""

    id: int
    memory_kib: int
    free_kib: int
    distances: dict[int, int] = field(default_factory=dict)
    hugepages: tuple[HugepagePool, ...] = ()

    def hugepage_pool(self, size_kib: int) -> HugepagePool | None:
        for pool in self.hugepages:
            if pool.size_kib == size_kib:
                return pool
        return None


@dataclass(frozen=True)
class Core:
    id: int
    node: int
    package: int
    cpus: tuple[int, ...]
    die: int = 0
    cluster: int | None = None


@dataclass(frozen=True)
class HostTopology:
    """NUMA nodes, packages, cores, threads and cache groups of one host."""

    nodes: dict[int, Node]
    cpus: dict[int, Cpu]
    reserved: frozenset[int] = frozenset()  # kept for the host by configuration
    isolated: frozenset[int] = frozenset()  # kernel isolcpus: usable only when pinned
    name: str = "host"
    warnings: tuple[str, ...] = ()  # what the reader could not read and what it assumed instead
    # Sizes of the L2 and last-level cache groups the host reported (group id -> KiB); a group
    # missing here was assumed or its size not said. Descriptive only: placement never reads them.
    l2_kib: dict[int, int] = field(default_factory=dict, compare=False)
    llc_kib: dict[int, int] = field(default_factory=dict, compare=False)
    llc_level: int | None = field(default=None, compare=False)  # None: no cache reported, LLC per die assumed

    # ----- construction helpers -------------------------------------------------
    def with_reserved(self, cpus: frozenset[int] | set[int]) -> HostTopology:
        unknown = set(cpus) - set(self.cpus)
        if unknown:
            raise ValueError(f"reserved CPUs {sorted(unknown)} do not exist on host {self.name}")
        return replace(self, reserved=frozenset(cpus))

    # ----- CPU sets ---------------------------------------------------------------
    @cached_property
    def online_cpus(self) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus.values() if c.online)

    @cached_property
    def usable_cpus(self) -> frozenset[int]:
        """Online CPUs that guests may use (reserved host CPUs removed)."""
        return self.online_cpus - self.reserved

    @cached_property
    def cores(self) -> tuple[Core, ...]:
        grouped: dict[int, list[Cpu]] = {}
        for cpu in self.cpus.values():
            grouped.setdefault(cpu.core, []).append(cpu)
        result = []
        for core_id in sorted(grouped, key=lambda k: min(c.id for c in grouped[k])):
            members = sorted(grouped[core_id], key=lambda c: c.id)
            first = members[0]
            result.append(Core(core_id, first.node, first.package, tuple(c.id for c in members),
                               die=first.die, cluster=first.cluster))
        return tuple(result)

    @cached_property
    def _core_by_id(self) -> dict[int, Core]:
        return {core.id: core for core in self.cores}

    @cached_property
    def smt(self) -> int:
        """Threads per core (the largest core; hybrid hosts mix 1 and 2)."""
        return max((len(core.cpus) for core in self.cores), default=1)

    @cached_property
    def packages(self) -> tuple[int, ...]:
        return tuple(sorted({c.package for c in self.cpus.values()}))

    @cached_property
    def llc_groups(self) -> dict[int, frozenset[int]]:
        groups: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            if cpu.llc is not None:
                groups.setdefault(cpu.llc, set()).add(cpu.id)
        return {k: frozenset(v) for k, v in sorted(groups.items())}

    @cached_property
    def l2_groups(self) -> dict[int, frozenset[int]]:
        groups: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            if cpu.l2 is not None:
                groups.setdefault(cpu.l2, set()).add(cpu.id)
        return {k: frozenset(v) for k, v in sorted(groups.items())}

    @cached_property
    def dies(self) -> dict[int, frozenset[int]]:
        """Online CPUs of each die (a package without dies is one die)."""
        groups: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            if cpu.online:
                groups.setdefault(cpu.die, set()).add(cpu.id)
        return {k: frozenset(v) for k, v in sorted(groups.items())}

    @cached_property
    def clusters(self) -> dict[int, frozenset[int]]:
        """Online CPUs of each cluster; empty when the host has no cluster level."""
        groups: dict[int, set[int]] = {}
        for cpu in self.cpus.values():
            if cpu.online and cpu.cluster is not None:
                groups.setdefault(cpu.cluster, set()).add(cpu.id)
        return {k: frozenset(v) for k, v in sorted(groups.items())}

    @cached_property
    def memory_only_nodes(self) -> tuple[int, ...]:
        """Nodes without any CPU (CXL, HBM or GPU memory): they never get guest memory by default."""
        with_cpus = {c.node for c in self.cpus.values()}
        return tuple(sorted(n for n in self.nodes if n not in with_cpus))

    # ----- queries ------------------------------------------------------------------
    def siblings(self, cpu: int) -> frozenset[int]:
        """SMT siblings of `cpu`, itself included."""
        return frozenset(self._core_by_id[self.cpus[cpu].core].cpus)

    def core_of(self, cpu: int) -> Core:
        return self._core_by_id[self.cpus[cpu].core]

    def cpus_in_node(self, node: int) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus.values() if c.node == node)

    def cores_in_node(self, node: int) -> tuple[Core, ...]:
        return tuple(core for core in self.cores if core.node == node)

    def cpus_in_llc(self, llc: int) -> frozenset[int]:
        return self.llc_groups.get(llc, frozenset())

    def nodes_with_cpus(self) -> tuple[int, ...]:
        return tuple(sorted({c.node for c in self.cpus.values()}))

    def free_cores(self, node: int | None, used: frozenset[int] | set[int]) -> tuple[Core, ...]:
        """Cores whose every thread is usable and unused (optionally in one node)."""
        usable = self.usable_cpus
        return tuple(
            core
            for core in self.cores
            if (node is None or core.node == node)
            and all(c in usable and c not in used for c in core.cpus)
        )

    def distance(self, node_a: int, node_b: int) -> int:
        """NUMA distance (10 = local); falls back to 10/20 when the host does not say."""
        distances = self.nodes[node_a].distances if node_a in self.nodes else {}
        if node_b in distances:
            return distances[node_b]
        return 10 if node_a == node_b else 20

    def distance_class(self, cpu_a: int, cpu_b: int) -> DistanceClass:
        if cpu_a == cpu_b:
            return DistanceClass.SAME_CPU
        a, b = self.cpus[cpu_a], self.cpus[cpu_b]
        if a.core == b.core:
            return DistanceClass.SAME_CORE
        if a.l2 is not None and a.l2 == b.l2:
            return DistanceClass.SAME_L2
        if a.llc is not None and a.llc == b.llc:
            return DistanceClass.SAME_LLC
        if a.node == b.node:
            return DistanceClass.SAME_NODE
        return DistanceClass.REMOTE_NODE

    # ----- serialisation (the `vmplacer topology --format json` contract) -----------
    def to_dict(self) -> dict[str, Any]:
        memory_only = set(self.memory_only_nodes)
        return {
            "name": self.name,
            "nodes": [
                {
                    "id": node.id,
                    "cpus": sorted(self.cpus_in_node(node.id)),
                    "memory_kib": node.memory_kib,
                    "free_kib": node.free_kib,
                    "distances": {str(k): v for k, v in sorted(node.distances.items())},
                    "hugepages": [
                        {"size_kib": p.size_kib, "total": p.total, "free": p.free}
                        for p in node.hugepages
                    ],
                    "memory_only": node.id in memory_only,
                }
                for node in sorted(self.nodes.values(), key=lambda n: n.id)
            ],
            "cores": [
                {"id": core.id, "node": core.node, "package": core.package, "die": core.die,
                 "cluster": core.cluster, "kind": self.cpus[core.cpus[0]].kind, "cpus": list(core.cpus)}
                for core in self.cores
            ],
            "dies": [{"id": k, "package": self.cpus[min(v)].package, "cpus": sorted(v)}
                     for k, v in self.dies.items()],
            "clusters": [{"id": k, "die": self.cpus[min(v)].die, "cpus": sorted(v)}
                         for k, v in self.clusters.items()],
            "llc": [{"id": k, "cpus": sorted(v), "level": self.llc_level, "size_kib": self.llc_kib.get(k)}
                    for k, v in self.llc_groups.items()],
            "l2": [{"id": k, "cpus": sorted(v), "size_kib": self.l2_kib.get(k)} for k, v in self.l2_groups.items()],
            "smt": self.smt,
            "packages": list(self.packages),
            "memory_only_nodes": list(self.memory_only_nodes),
            "offline": sorted(set(self.cpus) - self.online_cpus),
            "reserved": sorted(self.reserved),
            "isolated": sorted(self.isolated),
            "warnings": list(self.warnings),
        }


def uniform_topology(
    nodes: int = 1,
    cores_per_node: int = 4,
    threads_per_core: int = 1,
    memory_mib_per_node: int = 16384,
    llc_per_node: bool = True,
    name: str = "synthetic",
) -> HostTopology:
    """A regular synthetic host: handy for tests, benchmarks and the simulator.

    CPU numbering follows the common Linux/Intel scheme: all first threads of
    every core come first, then the second threads (siblings n and n+N).
    """
    total_cores = nodes * cores_per_node
    cpus: dict[int, Cpu] = {}
    for thread in range(threads_per_core):
        for core in range(total_cores):
            cpu_id = thread * total_cores + core
            node = core // cores_per_node
            cpus[cpu_id] = Cpu(
                id=cpu_id,
                node=node,
                package=node,
                die=node,
                core=core,
                l2=core,
                llc=node if llc_per_node else 0,
            )
    node_map = {
        n: Node(
            id=n,
            memory_kib=memory_mib_per_node * 1024,
            free_kib=memory_mib_per_node * 1024,
            distances={m: (10 if m == n else 21) for m in range(nodes)},
        )
        for n in range(nodes)
    }
    return HostTopology(nodes=node_map, cpus=cpus, name=name)
