"""One value model of a host's CPU and memory topology.

Readers (libvirt capabilities, sysfs) build it; the allocator, the interference
model and the simulator only query it. Immutable: a what-if change (reserving
CPUs, taking memory) returns a new object, so policies can explore freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from typing import Any


class DistanceClass(str, Enum):
    """How closely two pCPUs share hardware, from closest to farthest.

    `same-cpu` is one pCPU time-shared; the other five are the classes the
    interference model carries (METHOD.md §3).
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
    """One logical CPU (an SMT thread)."""

    id: int
    node: int
    package: int = 0
    die: int = 0
    core: int = 0  # global core index (unique across packages and dies)
    l2: int | None = None  # L2 group id; None when the host does not say
    llc: int | None = None  # last-level-cache group id
    online: bool = True
    kind: str | None = None  # hybrid hosts: "performance" / "efficiency"


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


@dataclass(frozen=True)
class HostTopology:
    """NUMA nodes, packages, cores, threads and cache groups of one host."""

    nodes: dict[int, Node]
    cpus: dict[int, Cpu]
    reserved: frozenset[int] = frozenset()  # kept for the host by configuration
    isolated: frozenset[int] = frozenset()  # kernel isolcpus: usable only when pinned
    name: str = "host"

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
            result.append(
                Core(core_id, members[0].node, members[0].package, tuple(c.id for c in members))
            )
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
                }
                for node in sorted(self.nodes.values(), key=lambda n: n.id)
            ],
            "cores": [
                {"id": core.id, "node": core.node, "package": core.package, "cpus": list(core.cpus)}
                for core in self.cores
            ],
            "llc": [{"id": k, "cpus": sorted(v)} for k, v in self.llc_groups.items()],
            "l2": [{"id": k, "cpus": sorted(v)} for k, v in self.l2_groups.items()],
            "smt": self.smt,
            "packages": list(self.packages),
            "offline": sorted(set(self.cpus) - self.online_cpus),
            "reserved": sorted(self.reserved),
            "isolated": sorted(self.isolated),
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


# ----- building a topology from what a reader found -------------------------------------
#
# Readers (libvirt capabilities, sysfs) only collect facts; numbering cores and
# cache groups happens here, once, so the same machine read two ways yields the
# same HostTopology.


class TopologyError(ValueError):
    """Facts about a host that contradict each other; the message names the CPU or node."""


@dataclass(frozen=True)
class CpuFacts:
    """What a reader learned about one logical CPU, before global numbering.

    `core_id` is the hardware id, which repeats per package (and per die).
    `package` and `core_id` are None when the host gives no topology for the
    CPU — offline CPUs, whose topology the kernel forgets.
    """

    id: int
    node: int
    online: bool = True
    package: int | None = None
    die: int = 0
    core_id: int | None = None
    siblings: frozenset[int] | None = None  # SMT siblings as reported, itself included
    kind: str | None = None


@dataclass(frozen=True)
class CacheFacts:
    """One cache instance: its level and the CPUs sharing it."""

    level: int
    cpus: frozenset[int]


def assemble_topology(
    cpus: Iterable[CpuFacts],
    nodes: Mapping[int, Node],
    caches: Iterable[CacheFacts] = (),
    *,
    isolated: Iterable[int] = (),
    name: str = "host",
) -> HostTopology:
    """Number cores and cache groups globally and build the HostTopology.

    Cores: CPUs reporting the same SMT sibling set form one core (without a
    sibling list: same package, die, hardware core id and node). Cores are
    numbered by (package, die, hardware core id, lowest CPU); CPUs without
    topology each get a core of their own, numbered after the others.
    Caches: L2 groups come from level-2 caches, LLC groups from the highest
    level >= 2 reported. When the host reports none, L2 falls back to one group
    per core and the LLC to one group per package — the usual hardware, and the
    safe assumption for the interference model (closer than same-node). Group
    ids are numbered by lowest CPU. Offline CPUs get no cache group.
    """
    facts: dict[int, CpuFacts] = {}
    for fact in cpus:
        if fact.id in facts:
            raise TopologyError(f"host {name}: CPU {fact.id} is listed twice")
        if fact.node not in nodes:
            raise TopologyError(
                f"host {name}: CPU {fact.id} is in NUMA node {fact.node}, which the host does not list"
            )
        facts[fact.id] = fact
    placed = {
        i: f for i, f in facts.items() if f.online and f.package is not None and f.core_id is not None
    }

    cores = _ordered_cores(placed, name)
    core_index = {cpu: index for index, members in enumerate(cores) for cpu in members}
    for index, cpu in enumerate(sorted(set(facts) - set(placed)), start=len(cores)):
        core_index[cpu] = index
    packages = _packages(facts, placed)
    l2_of, llc_of = _cache_groups(caches, facts, cores, packages, name)

    result = {
        i: Cpu(
            id=i,
            node=f.node,
            package=packages[i],
            die=max(f.die, 0),
            core=core_index[i],
            l2=l2_of.get(i),
            llc=llc_of.get(i),
            online=f.online,
            kind=f.kind,
        )
        for i, f in sorted(facts.items())
    }
    return HostTopology(
        nodes={k: nodes[k] for k in sorted(nodes)},
        cpus=result,
        isolated=frozenset(isolated) & frozenset(facts),
        name=name,
    )


def _ordered_cores(placed: Mapping[int, CpuFacts], name: str) -> list[list[int]]:
    """Cores (lists of CPU ids) in global order: package, die, hardware core id, lowest CPU."""

    def order(members: list[int]) -> tuple[int, int, int, int]:
        first = placed[members[0]]
        return (first.package or 0, first.die, min(placed[c].core_id or 0 for c in members), members[0])

    return sorted(_group_cores(placed, name), key=order)


def _packages(facts: Mapping[int, CpuFacts], placed: Mapping[int, CpuFacts]) -> dict[int, int]:
    """Package of every CPU; a CPU without topology (offline) gets its node's package."""
    by_node: dict[int, set[int]] = {}
    for fact in placed.values():
        by_node.setdefault(fact.node, set()).add(max(fact.package or 0, 0))
    everywhere = set().union(*by_node.values()) if by_node else {0}
    return {
        cpu: max(fact.package, 0) if fact.package is not None else min(by_node.get(fact.node) or everywhere)
        for cpu, fact in facts.items()
    }


def _cache_groups(
    caches: Iterable[CacheFacts],
    facts: Mapping[int, CpuFacts],
    cores: list[list[int]],
    packages: Mapping[int, int],
    name: str,
) -> tuple[dict[int, int], dict[int, int]]:
    """CPU -> L2 group id and CPU -> LLC group id, with the per-core / per-package fallbacks."""
    known = [CacheFacts(c.level, frozenset(c.cpus).intersection(facts)) for c in caches]
    known = [c for c in known if c.cpus and c.level >= 2]
    top_level = max((c.level for c in known), default=None)
    l2_sets = [c.cpus for c in known if c.level == 2] or [frozenset(m) for m in cores]
    llc_sets = [c.cpus for c in known if c.level == top_level]
    if not llc_sets:
        by_package: dict[int, set[int]] = {}
        for members in cores:
            by_package.setdefault(packages[members[0]], set()).update(members)
        llc_sets = [frozenset(s) for s in by_package.values()]
    return _number_groups(l2_sets, "L2", name), _number_groups(llc_sets, "last-level", name)


def _group_cores(placed: Mapping[int, CpuFacts], name: str) -> list[list[int]]:
    """Group CPUs into cores and check the host's sibling lists agree with each other."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for cpu_id, fact in sorted(placed.items()):
        if fact.siblings is not None:
            key: tuple[Any, ...] = ("siblings", fact.siblings.intersection(placed) | {cpu_id})
        else:
            key = ("ids", fact.package, fact.die, fact.core_id, fact.node)
        groups.setdefault(key, []).append(cpu_id)
    for key, members in groups.items():
        if key[0] == "siblings" and set(members) != key[1]:
            other = min(key[1] - set(members))
            raise TopologyError(
                f"host {name}: CPU {members[0]} reports SMT siblings {sorted(key[1])}, "
                f"but CPU {other} reports {sorted(placed[other].siblings or ())}"
            )
        first = placed[members[0]]
        for cpu_id in members[1:]:
            fact = placed[cpu_id]
            if (fact.node, fact.package, fact.die) != (first.node, first.package, first.die):
                raise TopologyError(
                    f"host {name}: SMT siblings {members[0]} and {cpu_id} disagree on "
                    f"node/package/die ({first.node}/{first.package}/{first.die} vs "
                    f"{fact.node}/{fact.package}/{fact.die})"
                )
    return list(groups.values())


def _number_groups(sets: Iterable[frozenset[int]], what: str, name: str) -> dict[int, int]:
    """Map CPU -> group id, groups numbered by lowest CPU; overlapping groups are an error."""
    distinct = sorted(set(sets), key=min)
    group_of: dict[int, int] = {}
    for index, members in enumerate(distinct):
        for cpu in members:
            if cpu in group_of:
                raise TopologyError(
                    f"host {name}: CPU {cpu} is in two different {what} caches "
                    f"({sorted(distinct[group_of[cpu]])} and {sorted(members)})"
                )
            group_of[cpu] = index
    return group_of
