"""How good a feasible placement is: pluggable scorers, higher is better.

The allocator builds every feasible candidate it considers and keeps the one
with the best score, so a policy is changed by changing scorers, not the
search. Each built-in scorer returns a value in [0, 1]; `WeightedScorer`
combines them. The interference model plugs in as one more `Scorer`
(core/placement/interference_scorer.py); a scorer with an `alternatives` attribute asks
the engine to build that many more candidate pCPU choices per node.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol, runtime_checkable

from vmplacer.core.placement.occupancy import HostUsage, exclusive_of, memory_by_node, split_vcpus, usage_of
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology


@runtime_checkable
class Scorer(Protocol):
    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        """Higher is better. `others` are the placements already on the host."""
        ...


def _cpu_nodes(topology: HostTopology, cpus: Iterable[int]) -> set[int]:
    return {topology.cpus[c].node for c in cpus if c in topology.cpus}


@dataclass(frozen=True)
class LocalityScorer:
    """Few nodes, close nodes, and vCPUs of a cell inside one cache domain.

    docs/research/method.md §1: all vCPUs and memory on one node beat split layouts by ~29 %
    for sensitive guests; splitting vCPUs hurts communication-heavy guests most.
    Extra nodes beyond the guest's own cells cost the most; then the mean
    NUMA distance between the nodes used; then LLC spread within a cell.
    """

    node_weight: float = 0.7

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        nodes = _cpu_nodes(topology, placement.pcpus) | set(memory_by_node(topology, placement))
        cells = max(1, len(placement.cells))
        extra = max(0, len(nodes) - cells)
        if len(nodes) <= 1:
            distance_term = 1.0
        else:
            pairs = list(combinations(sorted(nodes), 2))
            mean = sum(topology.distance(a, b) for a, b in pairs) / len(pairs)
            local = topology.distance(min(nodes), min(nodes)) or 10
            distance_term = min(1.0, local / mean) if mean > 0 else 1.0
        node_term = distance_term / (1 + extra)
        return self.node_weight * node_term + (1 - self.node_weight) * self._llc_term(topology, placement)

    @staticmethod
    def _llc_term(topology: HostTopology, placement: Placement) -> float:
        """Per cell: the share of its pinned vCPUs in its busiest LLC times the share in its
        busiest die — a cell that must span LLCs had better stay on one die."""
        dedicated, _ = split_vcpus(placement)
        if not dedicated:
            return 1.0
        groups = [list(c.vcpus) for c in placement.cells] or [list(placement.vcpupin)]
        fractions = []
        for vcpus in groups:
            cpus = [topology.cpus[dedicated[v]] for v in vcpus if v in dedicated and dedicated[v] in topology.cpus]
            llcs = [cpu.llc for cpu in cpus]
            if not llcs or any(llc is None for llc in llcs):
                continue
            fractions.append(_top_share(llcs) * _top_share([cpu.die for cpu in cpus]))
        return sum(fractions) / len(fractions) if fractions else 1.0


def _top_share(values: Sequence[Hashable]) -> float:
    """Share of the most common value (1.0 when all are equal)."""
    return max(values.count(value) for value in set(values)) / len(values)


@dataclass(frozen=True)
class PackingScorer:
    """Keep whole cores free for future dedicated/isolated guests.

    Penalises cores that were entirely free and that the placement now uses
    only partly (it "broke" them), relative to the cores it touches.
    """

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        before = usage_of(topology, others)
        owned = exclusive_of(placement)
        dedicated, _ = split_vcpus(placement)
        used = owned | set(dedicated.values())
        if not used:
            return 1.0
        touched = {topology.core_of(c).id: topology.core_of(c) for c in used if c in topology.cpus}
        broken = 0
        for core in touched.values():
            threads = [c for c in core.cpus if topology.cpus[c].online]
            was_free = all(c in topology.usable_cpus and c not in before.exclusive for c in threads)
            fully_ours = all(c in used for c in threads)
            if was_free and not fully_ours:
                broken += 1
        return 1.0 - broken / len(touched)


@dataclass(frozen=True)
class SiblingScorer:
    """Avoid co-runners on SMT siblings and crowded shared pools.

    SMT siblings hurt most (docs/research/method.md §1: ~22 % mean IPC loss for sibling pairs
    against ~4 % on separate cores). A dedicated vCPU scores by whether its
    sibling threads run someone else; a floating vCPU by the shared load per
    pCPU of its node after placement.
    """

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        before = usage_of(topology, others)
        dedicated, shared = split_vcpus(placement)
        if not dedicated and not shared:
            return 1.0
        penalty = 0.0
        for cpu in dedicated.values():
            if before.sibling_busy(cpu):
                penalty += 1.0
        if shared:
            pools: dict[int, int] = {}
            new_load: dict[int, float] = {}
            for pins in shared.values():
                nodes = _cpu_nodes(topology, pins) or set(topology.nodes_with_cpus())
                for node in nodes:
                    new_load[node] = new_load.get(node, 0.0) + 1.0 / len(nodes)
            for node in new_load:
                pools[node] = max(1, len(before.shared_pool(node) - exclusive_of(placement)))
            for pins in shared.values():
                nodes = _cpu_nodes(topology, pins) or set(topology.nodes_with_cpus())
                pressure = sum(
                    (before.shared_load.get(n, 0.0) + new_load[n]) / pools[n] for n in nodes
                ) / len(nodes)
                penalty += min(1.0, pressure / 4.0)
        return 1.0 - penalty / (len(dedicated) + len(shared))


@dataclass(frozen=True)
class BalanceScorer:
    """Spread load across nodes: 1 minus the utilisation gap between nodes after placement."""

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        before = usage_of(topology, others)
        nodes = [n for n, cpus in before.index.node_usable.items() if cpus]
        if len(nodes) < 2:
            return 1.0
        after = before.with_placement(placement)
        utilisation = [_node_utilisation(after, n) for n in nodes]
        return 1.0 - (max(utilisation) - min(utilisation))


def node_utilisation(usage: HostUsage, node: int) -> float:
    """The larger of a node's CPU share taken (owned plus floating) and its memory share taken."""
    return _node_utilisation(usage, node)


def _node_utilisation(usage: HostUsage, node: int) -> float:
    topo = usage.topology
    cpus = usage.index.node_usable[node]
    owned = len(cpus & usage.exclusive)
    pool = len(cpus) - owned
    floating = min(float(pool), usage.shared_load.get(node, 0.0))
    cpu_util = (owned + floating) / len(cpus)
    info = topo.nodes[node]
    mem_util = 0.0
    if info.memory_kib > 0:
        taken = usage.small_used_kib.get(node, 0) + sum(
            pages * size for (n, size), pages in usage.huge_used.items() if n == node
        )
        mem_util = min(1.0, taken / info.memory_kib)
    return max(cpu_util, mem_util)


@dataclass(frozen=True)
class AffinityScorer:
    """Soft affinity: the share of the named peers on this host that share a node with the guest."""

    peers: tuple[str, ...]

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        usage = usage_of(topology, others)
        present = [p for p in self.peers if p in usage.guest_nodes]
        if not present:
            return 1.0
        mine = _cpu_nodes(topology, placement.pcpus) | set(memory_by_node(topology, placement))
        return sum(1 for p in present if usage.guest_nodes[p] & mine) / len(present)


@dataclass(frozen=True)
class WeightedScorer:
    """A weighted mean of scorers; the default policy and any plug-in combine this way."""

    parts: tuple[tuple[float, Scorer], ...]

    def score(self, topology: HostTopology, placement: Placement, others: Sequence[Placement]) -> float:
        total = sum(weight for weight, _ in self.parts)
        if total <= 0:
            return 0.0
        return sum(w * s.score(topology, placement, others) for w, s in self.parts) / total

    def plus(self, weight: float, scorer: Scorer) -> WeightedScorer:
        return WeightedScorer((*self.parts, (weight, scorer)))

    @property
    def alternatives(self) -> int:
        """Extra candidate starting cores per node that some part asks the engine to build."""
        return max((getattr(s, "alternatives", 0) for w, s in self.parts if w > 0), default=0)


DEFAULT_WEIGHTS = {"locality": 0.4, "packing": 0.2, "siblings": 0.2, "balance": 0.2}


def default_scorer() -> WeightedScorer:
    """Locality first, then whole cores kept free, quiet siblings and balanced nodes."""
    return WeightedScorer((
        (DEFAULT_WEIGHTS["locality"], LocalityScorer()),
        (DEFAULT_WEIGHTS["packing"], PackingScorer()),
        (DEFAULT_WEIGHTS["siblings"], SiblingScorer()),
        (DEFAULT_WEIGHTS["balance"], BalanceScorer()),
    ))
