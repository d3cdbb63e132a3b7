"""Build a HostTopology from what a reader found (libvirt capabilities, sysfs).

Readers only collect facts and say what they could not read; numbering
packages, dies, clusters, cores and cache groups happens here, once, so the
same machine read two ways yields the same HostTopology.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.topology.host import Cpu, HostTopology, Node

# x86 kernels print cluster_id 65535 when they do not know the cluster (libvirt passes it on).
UNKNOWN_CLUSTER = 0xFFFF


class TopologyError(ValueError):
    """Facts about a host that contradict each other; the message names the CPU or node."""


@dataclass(frozen=True)
class CpuFacts:
    """What a reader learned about one logical CPU, before global numbering.

    Ids are the hardware's: `core_id` repeats per package (and per die),
    `cluster` per die. `package` is None (or negative) when the host does not
    report it; `package_cpus` (the CPUs of the same package) then groups
    packages. `core_id` is None when unknown; SMT `siblings` then group cores.
    Offline CPUs carry no topology: the kernel forgets it.
    """

    id: int
    node: int
    online: bool = True
    package: int | None = None
    die: int = 0
    core_id: int | None = None
    siblings: frozenset[int] | None = None  # SMT siblings as reported, itself included
    kind: str | None = None
    cluster: int | None = None  # None, negative or 65535: the host has no cluster level
    package_cpus: frozenset[int] | None = None


@dataclass(frozen=True)
class CacheFacts:
    """One cache instance: its level, the CPUs sharing it, its size when the host says it, and
    where the reader found it."""

    level: int
    cpus: frozenset[int]
    source: str | None = field(default=None, compare=False)
    size_kib: int | None = field(default=None, compare=False)


def assemble_topology(
    cpus: Iterable[CpuFacts],
    nodes: Mapping[int, Node],
    caches: Iterable[CacheFacts] = (),
    *,
    isolated: Iterable[int] = (),
    name: str = "host",
    warnings: Iterable[str] = (),
) -> HostTopology:
    """Number packages, dies, clusters, cores and cache groups globally; build the HostTopology.

    Packages: the reported ids; when no CPU reports one, groups of
    `package_cpus`, else one package per NUMA node. Dies: (package, die id),
    numbered in that order. Cores: CPUs reporting the same SMT sibling set
    (without one: same package, die, core id and node; without a core id
    either: a core of its own), numbered by (package, die, core id, lowest
    CPU); offline CPUs each get a core of their own, numbered last.
    Clusters: (package, die, cluster id), kept only when they say more than
    the cores and dies do. Caches: a cache shared by a thread is shared by its
    core; L2 groups from level-2 caches, LLC groups from the highest level >= 2
    reported; CPUs no cache covers get one L2 per core and one LLC per die —
    the usual hardware, and the safe assumption for the interference model.
    Group ids are numbered by lowest CPU. Offline CPUs get no cache group.
    """
    facts = _checked(cpus, nodes, name)
    online = {i: f for i, f in facts.items() if f.online}
    packages = _packages(facts, online, name)
    raw_die = {i: max(f.die, 0) for i, f in facts.items()}
    cores = _ordered_cores(online, packages, raw_die, name)
    core_index = {cpu: index for index, members in enumerate(cores) for cpu in members}
    for index, cpu in enumerate(sorted(set(facts) - set(online)), start=len(cores)):
        core_index[cpu] = index
    die_of = _dies(facts, online, packages, raw_die)
    cluster_of = _clusters(online, packages, raw_die, cores, die_of, name)
    caches = list(caches)
    l2_of, llc_of = _cache_groups(caches, online, cores, die_of, name)

    result = {
        i: Cpu(
            id=i,
            node=f.node,
            package=packages[i],
            die=die_of[i],
            core=core_index[i],
            l2=l2_of.get(i),
            llc=llc_of.get(i),
            online=f.online,
            kind=f.kind,
            cluster=cluster_of.get(i),
        )
        for i, f in sorted(facts.items())
    }
    top_level = max((c.level for c in caches if c.level >= 2), default=None)
    return HostTopology(
        nodes={k: nodes[k] for k in sorted(nodes)},
        cpus=result,
        isolated=frozenset(isolated) & frozenset(facts),
        name=name,
        warnings=tuple(dict.fromkeys(warnings)),
        l2_kib=_group_sizes(caches, 2, l2_of, cores),
        llc_kib=_group_sizes(caches, top_level, llc_of, cores),
        llc_level=top_level,
    )


def _group_sizes(caches: Iterable[CacheFacts], level: int | None, group_of: Mapping[int, int],
                 cores: list[list[int]]) -> dict[int, int]:
    """Group id -> size in KiB of the reported caches of `level` (what the operator sizes guests
    by); groups the reader assumed, or whose size the host did not say, are left out."""
    if level is None:
        return {}
    sizes: dict[int, int] = {}
    for cache in caches:
        if cache.level != level or cache.size_kib is None:
            continue
        groups = {group_of[cpu] for cpu in cache.cpus if cpu in group_of}
        if len(groups) == 1:
            sizes.setdefault(groups.pop(), cache.size_kib)
    return dict(sorted(sizes.items()))


def _checked(cpus: Iterable[CpuFacts], nodes: Mapping[int, Node], name: str) -> dict[int, CpuFacts]:
    facts: dict[int, CpuFacts] = {}
    for fact in cpus:
        if fact.id in facts:
            raise TopologyError(f"host {name}: CPU {fact.id} is listed twice")
        if fact.node not in nodes:
            raise TopologyError(
                f"host {name}: CPU {fact.id} is in NUMA node {fact.node}, which the host does not list"
            )
        facts[fact.id] = fact
    return facts


def _packages(facts: Mapping[int, CpuFacts], online: Mapping[int, CpuFacts], name: str) -> dict[int, int]:
    """Package of every CPU (see assemble_topology); offline CPUs take their node's lowest package."""

    def reported(fact: CpuFacts) -> bool:
        return fact.package is not None and fact.package >= 0

    package_of: dict[int, int] = {}
    if online and not any(reported(f) for f in online.values()):
        if all(f.package_cpus for f in online.values()):
            groups = [frozenset((f.package_cpus or frozenset()) & online.keys()) | {i} for i, f in online.items()]
            package_of = _number_groups(groups, "packages", name)
        else:
            package_of = {i: f.node for i, f in online.items()}
    else:
        package_of = {i: f.package for i, f in online.items() if reported(f) and f.package is not None}
        for i, f in online.items():
            if i not in package_of:
                mates = sorted(package_of[m] for m in (f.package_cpus or ()) if m in package_of)
                if mates:
                    package_of[i] = mates[0]
    by_node: dict[int, set[int]] = {}
    for i, package in package_of.items():
        by_node.setdefault(facts[i].node, set()).add(package)
    everywhere = set().union(*by_node.values()) or {0}
    for i, fact in facts.items():
        if i not in package_of:
            package_of[i] = min(by_node.get(fact.node) or everywhere)
    return package_of


def _dies(facts: Mapping[int, CpuFacts], online: Mapping[int, CpuFacts], packages: Mapping[int, int],
          raw_die: Mapping[int, int]) -> dict[int, int]:
    """Global die index of every CPU, numbered by (package, die id); offline CPUs: their package's first."""
    keys = sorted({(packages[i], raw_die[i]) for i in online})
    index = {key: n for n, key in enumerate(keys)}
    first_of_package: dict[int, int] = {}
    for (package, _), n in index.items():
        first_of_package.setdefault(package, n)
    return {
        i: index[(packages[i], raw_die[i])] if i in online else first_of_package.get(packages[i], 0)
        for i in facts
    }


def _ordered_cores(online: Mapping[int, CpuFacts], packages: Mapping[int, int], raw_die: Mapping[int, int],
                   name: str) -> list[list[int]]:
    """Cores (lists of CPU ids) in global order: package, die, hardware core id, lowest CPU."""

    def order(members: list[int]) -> tuple[int, int, int, int]:
        ids = [online[c].core_id for c in members]
        core_key = min(i for i in ids if i is not None) if None not in ids else members[0]
        return (packages[members[0]], raw_die[members[0]], core_key, members[0])

    return sorted(_group_cores(online, packages, raw_die, name), key=order)


def _group_cores(online: Mapping[int, CpuFacts], packages: Mapping[int, int], raw_die: Mapping[int, int],
                 name: str) -> list[list[int]]:
    """Group CPUs into cores and check the host's sibling lists agree with each other.

    A CPU without a sibling list joins the core a sibling list names it in.
    """
    claimed: dict[int, frozenset[int]] = {}
    for cpu_id, fact in sorted(online.items()):
        if fact.siblings is not None:
            core = fact.siblings.intersection(online) | {cpu_id}
            for member in core:
                claimed.setdefault(member, core)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for cpu_id, fact in sorted(online.items()):
        if fact.siblings is not None:
            key: tuple[Any, ...] = ("siblings", fact.siblings.intersection(online) | {cpu_id})
        elif cpu_id in claimed:
            key = ("siblings", claimed[cpu_id])
        elif fact.core_id is not None:
            key = ("ids", packages[cpu_id], raw_die[cpu_id], fact.core_id, fact.node)
        else:
            key = ("alone", cpu_id)
        groups.setdefault(key, []).append(cpu_id)
    for key, members in groups.items():
        if key[0] == "siblings" and set(members) != key[1]:
            other = min(key[1] - set(members))
            raise TopologyError(
                f"host {name}: CPU {members[0]} reports SMT siblings {sorted(key[1])}, "
                f"but CPU {other} reports {sorted(online[other].siblings or ())}"
            )
        first = members[0]
        for cpu_id in members[1:]:
            mine = (online[cpu_id].node, packages[cpu_id], raw_die[cpu_id])
            theirs = (online[first].node, packages[first], raw_die[first])
            if mine != theirs:
                raise TopologyError(
                    f"host {name}: SMT siblings {first} and {cpu_id} disagree on "
                    f"node/package/die ({'/'.join(map(str, theirs))} vs {'/'.join(map(str, mine))})"
                )
    return list(groups.values())


def _clusters(online: Mapping[int, CpuFacts], packages: Mapping[int, int], raw_die: Mapping[int, int],
              cores: list[list[int]], die_of: Mapping[int, int], name: str) -> dict[int, int]:
    """CPU -> global cluster index; empty when the host has no cluster level worth the name.

    A host without clusters reports none (old kernels), -1 (the kernel's
    default), 65535 (x86 when unknown) or, through libvirt, 0 everywhere (one
    cluster per die). Clusters equal to the cores or to the dies carry no
    information and are dropped.
    """
    if not online or not all(f.cluster is not None and 0 <= f.cluster != UNKNOWN_CLUSTER
                             for f in online.values()):
        return {}
    key = {i: (packages[i], raw_die[i], f.cluster) for i, f in online.items()}
    for members in cores:
        split = [c for c in members if key[c] != key[members[0]]]
        if split:
            raise TopologyError(f"host {name}: SMT siblings {members[0]} and {split[0]} report different "
                                f"clusters ({online[members[0]].cluster} and {online[split[0]].cluster})")
    grouped: dict[tuple[int, int, int | None], set[int]] = {}
    for cpu, k in key.items():
        grouped.setdefault(k, set()).add(cpu)
    partition = {frozenset(g) for g in grouped.values()}
    by_die: dict[int, set[int]] = {}
    for cpu in online:
        by_die.setdefault(die_of[cpu], set()).add(cpu)
    if partition == {frozenset(m) for m in cores} or partition == {frozenset(g) for g in by_die.values()}:
        return {}
    ordered = sorted(partition, key=lambda g: (die_of[min(g)], min(g)))
    return {cpu: index for index, members in enumerate(ordered) for cpu in members}


def _cache_groups(
    caches: Iterable[CacheFacts],
    online: Mapping[int, CpuFacts],
    cores: list[list[int]],
    die_of: Mapping[int, int],
    name: str,
) -> tuple[dict[int, int], dict[int, int]]:
    """CPU -> L2 group id and CPU -> LLC group id, with the per-core / per-die fallbacks."""
    core_of = {cpu: frozenset(members) for members in cores for cpu in members}

    def whole_cores(cpus: frozenset[int]) -> frozenset[int]:
        return frozenset().union(*(core_of[c] for c in cpus if c in core_of))

    known = [CacheFacts(c.level, whole_cores(frozenset(c.cpus)), c.source) for c in caches if c.level >= 2]
    known = [c for c in known if c.cpus]
    sources: dict[frozenset[int], str] = {}
    for cache in known:
        if cache.source:
            sources.setdefault(cache.cpus, cache.source)
    top_level = max((c.level for c in known), default=None)
    l2_sets = [c.cpus for c in known if c.level == 2]
    llc_sets = [c.cpus for c in known if c.level == top_level]
    covered_l2 = frozenset().union(*l2_sets)
    l2_sets += [frozenset(m) for m in cores if not covered_l2 & set(m)]
    covered_llc = frozenset().union(*llc_sets)
    by_die: dict[int, set[int]] = {}
    for cpu in online:
        if cpu not in covered_llc:
            by_die.setdefault(die_of[cpu], set()).add(cpu)
    llc_sets += [frozenset(s) for s in by_die.values()]
    return (_number_groups(l2_sets, "L2 caches", name, sources),
            _number_groups(llc_sets, "last-level caches", name, sources))


def _number_groups(sets: Iterable[frozenset[int]], what: str, name: str,
                   sources: Mapping[frozenset[int], str] | None = None) -> dict[int, int]:
    """Map CPU -> group id, groups numbered by lowest CPU; overlapping groups are an error."""
    distinct = sorted(set(sets), key=min)
    group_of: dict[int, int] = {}

    def named(members: frozenset[int]) -> str:
        source = (sources or {}).get(members)
        return f"{sorted(members)}" + (f" in {source}" if source else "")

    for index, members in enumerate(distinct):
        for cpu in members:
            if cpu in group_of:
                raise TopologyError(
                    f"host {name}: CPU {cpu} is in two different {what} "
                    f"({named(distinct[group_of[cpu]])} and {named(members)})"
                )
            group_of[cpu] = index
    return group_of
