"""What the placements already on a host take: exclusive pCPUs, shared load, memory.

Derived from `Placement` values only, so placements parsed from live domain
XML and placements just planned are accounted the same way. The allocator
checks constraints against it and the scorers read it; `Occupancy` computes
it once per host state instead of once per candidate.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.topology.host import HostTopology

SMALL_PAGE_KIB = 4


def exclusive_of(placement: Placement) -> frozenset[int]:
    """pCPUs nobody else may use. Older/foreign placements flagged dedicated own their pins."""
    if placement.exclusive_cpus:
        return placement.exclusive_cpus
    return placement.pcpus if placement.dedicated else frozenset()


def split_vcpus(placement: Placement) -> tuple[dict[int, int], dict[int, frozenset[int]]]:
    """(dedicated vCPU -> its pCPU, shared vCPU -> the pCPUs it floats over).

    A vCPU is dedicated when it is pinned to one pCPU inside the placement's
    exclusive set; everything else floats (an empty pin means "anywhere").
    """
    owned = exclusive_of(placement)
    dedicated: dict[int, int] = {}
    shared: dict[int, frozenset[int]] = {}
    for vcpu, pins in placement.vcpupin.items():
        if len(pins) == 1 and pins <= owned:
            dedicated[vcpu] = next(iter(pins))
        else:
            shared[vcpu] = pins
    return dedicated, shared


def memory_by_node(topology: HostTopology, placement: Placement) -> dict[int, int]:
    """KiB of guest memory per host node: from its cells (a cell's named memory-only node, else
    its node), else its memory nodes, else its CPUs, else spread over the nodes with online
    CPUs — never onto a CPU-less node nobody named."""
    result: dict[int, int] = {}
    if placement.cells:
        for cell in placement.cells:
            node = cell.memory_host_node
            if node in topology.nodes:
                result[node] = result.get(node, 0) + cell.memory_kib
        if result:
            return result
    nodes = sorted(n for n in placement.memory_nodes if n in topology.nodes)
    if not nodes:
        nodes = sorted({topology.cpus[c].node for c in placement.pcpus if c in topology.cpus})
    if not nodes:
        nodes = sorted({topology.cpus[c].node for c in topology.online_cpus}) or sorted(topology.nodes)
    if not nodes or placement.memory_kib <= 0:
        return result
    share, rest = divmod(placement.memory_kib, len(nodes))
    for index, node in enumerate(nodes):
        result[node] = share + (1 if index < rest else 0)
    return result


class TopologyIndex:
    """Per-node CPU sets of one topology, computed once (HostTopology derives them per call)."""

    def __init__(self, topology: HostTopology):
        by_node: dict[int, set[int]] = {n: set() for n in topology.nodes}
        for cpu in topology.cpus.values():
            by_node.setdefault(cpu.node, set()).add(cpu.id)
        usable, isolated = topology.usable_cpus, topology.isolated
        self.node_cpus = {n: frozenset(cpus) for n, cpus in by_node.items()}
        self.node_usable = {n: cpus & usable for n, cpus in self.node_cpus.items()}
        self.node_floating = {n: frozenset(c for c in cpus if c not in isolated)
                              for n, cpus in self.node_usable.items()}
        self.cpu_node = {cpu.id: cpu.node for cpu in topology.cpus.values()}


@dataclass
class HostUsage:
    """Resources taken on one host by a set of placements."""

    topology: HostTopology
    exclusive: set[int] = field(default_factory=set)  # owned by one guest
    busy: set[int] = field(default_factory=set)  # running a dedicated vCPU or an isolated emulator
    shared_load: dict[int, float] = field(default_factory=dict)  # floating vCPUs per node
    small_used_kib: dict[int, int] = field(default_factory=dict)
    huge_used: dict[tuple[int, int], int] = field(default_factory=dict)  # (node, size KiB) -> pages
    guest_nodes: dict[str, frozenset[int]] = field(default_factory=dict)  # CPU and memory nodes
    guest_cpus: dict[str, frozenset[int]] = field(default_factory=dict)
    _index: TopologyIndex | None = field(default=None, repr=False, compare=False)
    # what is derived from this usage (e.g. the allocator's node views), dropped by every `add`
    derived: dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def index(self) -> TopologyIndex:
        if self._index is None:
            self._index = TopologyIndex(self.topology)
        return self._index

    @classmethod
    def build(cls, topology: HostTopology, placements: Iterable[Placement]) -> HostUsage:
        usage = cls(topology)
        for placement in placements:
            usage.add(placement)
        return usage

    def copy(self) -> HostUsage:
        return HostUsage(
            self.topology, set(self.exclusive), set(self.busy), dict(self.shared_load),
            dict(self.small_used_kib), dict(self.huge_used), dict(self.guest_nodes),
            dict(self.guest_cpus), self.index,
        )

    def with_placement(self, placement: Placement) -> HostUsage:
        usage = self.copy()
        usage.add(placement)
        return usage

    def add(self, placement: Placement) -> None:
        self.derived.clear()
        topo = self.topology
        owned = exclusive_of(placement)
        self.exclusive |= owned
        dedicated, shared = split_vcpus(placement)
        self.busy.update(dedicated.values())
        if placement.emulatorpin and placement.emulatorpin <= owned:
            self.busy |= placement.emulatorpin
        for pins in shared.values():
            nodes = self._nodes_of(pins) or {n for n, c in self.index.node_cpus.items() if c}
            for node in nodes:
                self.shared_load[node] = self.shared_load.get(node, 0.0) + 1.0 / len(nodes)
        memory = memory_by_node(topo, placement)
        page = placement.hugepage_kib
        for node, kib in memory.items():
            if page and page > SMALL_PAGE_KIB:
                key = (node, page)
                self.huge_used[key] = self.huge_used.get(key, 0) + -(-kib // page)
            else:
                self.small_used_kib[node] = self.small_used_kib.get(node, 0) + kib
        cpu_nodes = self._nodes_of(placement.pcpus)
        self.guest_nodes[placement.guest] = frozenset(cpu_nodes | set(memory))
        self.guest_cpus[placement.guest] = placement.pcpus | placement.emulatorpin

    def _nodes_of(self, cpus: Iterable[int]) -> set[int]:
        table = self.index.cpu_node
        return {table[c] for c in cpus if c in table}

    # ----- queries -----------------------------------------------------------------------
    def shared_pool(self, node: int) -> frozenset[int]:
        """pCPUs of `node` that floating vCPUs may use: usable, not isolcpus, not owned."""
        return self.index.node_floating.get(node, frozenset()) - self.exclusive

    def small_free_kib(self, node: int, reserved_kib: int = 0) -> int:
        """Small-page memory left on `node`.

        Capacity is the node's memory minus its hugepage pools and the host's
        reserve, minus what placements take; it is also capped by the free
        memory the host reported, so a live host never looks emptier than it is.
        """
        info = self.topology.nodes[node]
        huge = sum(p.size_kib * p.total for p in info.hugepages if p.size_kib > SMALL_PAGE_KIB)
        capacity = info.memory_kib - huge - reserved_kib - self.small_used_kib.get(node, 0)
        return max(0, min(capacity, info.free_kib - reserved_kib))

    def huge_free_pages(self, node: int, size_kib: int) -> int:
        """Pages of `size_kib` left on `node` (pool total minus placements, capped by free)."""
        pool = self.topology.nodes[node].hugepage_pool(size_kib)
        if pool is None:
            return 0
        return max(0, min(pool.total - self.huge_used.get((node, size_kib), 0), pool.free))

    def sibling_busy(self, cpu: int) -> bool:
        """Does another thread of this pCPU's core run someone else's vCPU (pinned or floating)?"""
        topo = self.topology
        for sibling in topo.siblings(cpu):
            if sibling == cpu:
                continue
            if sibling in self.busy:
                return True
            node = topo.cpus[sibling].node
            if self.shared_load.get(node, 0.0) > 0 and sibling not in self.exclusive \
                    and sibling in topo.usable_cpus and sibling not in topo.isolated:
                return True
        return False


class Occupancy(tuple[Placement, ...]):
    """The placements on a host, as a tuple that caches its `HostUsage` per topology."""

    def __new__(cls, placements: Iterable[Placement] = ()) -> Occupancy:
        return super().__new__(cls, tuple(placements))

    def usage(self, topology: HostTopology) -> HostUsage:
        cache = self.__dict__.setdefault("_usage", {})
        key = id(topology)
        entry: tuple[HostTopology, HostUsage] | None = cache.get(key)
        if entry is None or entry[0] is not topology:
            entry = (topology, HostUsage.build(topology, self))
            cache[key] = entry
        return entry[1]


def same_layout(a: HostTopology, b: HostTopology) -> bool:
    """Same CPUs (ids, nodes, cores, online), nodes, reserved and isolated CPUs: what a usage's
    sums and its TopologyIndex depend on (free memory and hugepage pools are read at query time)."""
    return a is b or (a.cpus == b.cpus and a.nodes.keys() == b.nodes.keys() and a.reserved == b.reserved
                      and a.isolated == b.isolated)


def occupancy_after(previous: Occupancy | None, topology: HostTopology,
                    placements: Sequence[Placement]) -> Occupancy:
    """`placements` as an Occupancy whose usage is `previous`'s plus what was added since.

    Placing on a host with hundreds of guests rebuilt the usage of all of them for every
    request; between two requests usually only new guests appear. When every placement of
    `previous` is still in `placements` unchanged (the same object, or an equal one) the
    usage is a copy of the previous one with the new placements added; anything removed or
    changed rebuilds it. The previous usage is never modified. A host's topology is read
    anew for each placement (its free memory changes); the usage depends only on its layout
    (CPUs, nodes, reserved and isolated CPUs), so a topology of the same layout extends it."""
    current = Occupancy(placements)
    if previous is None:
        return current
    cached = next(iter(previous.__dict__.get("_usage", {}).values()), None)
    if cached is None or not same_layout(cached[0], topology):
        return current
    by_guest = {p.guest: p for p in current}
    if len(by_guest) != len(current) or len(previous) > len(current):
        return current
    for before in previous:
        now = by_guest.pop(before.guest, None)
        if now is None or (now is not before and now != before):
            return current
    if not by_guest and cached[0] is topology:
        usage = cached[1]  # nothing new on the same topology: usages are never modified
    else:
        usage = cached[1].copy()
        usage.topology = topology  # free memory is read from the newest topology
    for added in by_guest.values():
        usage.add(added)
    current.__dict__["_usage"] = {id(topology): (topology, usage)}
    return current


def usage_of(topology: HostTopology, others: Sequence[Placement]) -> HostUsage:
    """The usage of `others`, computed once when they come as an `Occupancy`."""
    if isinstance(others, Occupancy):
        return others.usage(topology)
    return HostUsage.build(topology, others)
