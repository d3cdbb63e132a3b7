"""Host choice at fleet scale: filter on each host's free room, then allocate on a few.

Allocating a guest on a host (core/placement/allocate.py) builds and scores real candidates; doing it
on every host of a fleet of 1,000 for every guest costs seconds. As the Kubernetes scheduler
does (filter, then score a share of the feasible nodes, from a node-info snapshot kept up to
date), host choice here works from a summary of each host's free room, computed once per host
state from the allocator's own node views:

1. **filter** — a host whose free room cannot hold the guest (threads, whole cores for
   `isolate`, memory for any page size it accepts) is dropped before any allocation. The test
   is a necessary condition only: a host it keeps may still refuse the guest, a host it drops
   never takes it;
2. **rank** — the others by the default scorer's value estimated from the room alone (which
   node the guest fits, how even the nodes are after it, whether it breaks whole cores or
   lands beside busy siblings), then the tightest host first;
3. **score** — full allocation on the most promising host of each host shape, then on the most
   promising others up to `hosts_to_score`, identical hosts (same shape, nothing on them)
   counted once. Callers fall back to every host when none of those
   takes the guest, so whether a guest fits somewhere is never bounded, only which host wins.

Pure: hosts' node views in, orderings out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.occupancy import SMALL_PAGE_KIB, HostUsage
from vmplacer.core.placement.admit import AllocationOptions, NodeView, node_views
from vmplacer.core.placement.scoring import node_utilisation
from vmplacer.core.topology.host import HostTopology

# Hosts allocated on per guest once the filter has run (besides identical ones, counted once,
# and the most promising host of each shape); measured in benchmarks/fleet.py against
# allocating on every host.
DEFAULT_HOSTS_TO_SCORE = 8


@dataclass(frozen=True)
class NodeRoom:
    """One node's free room and how full it is (as BalanceScorer measures it)."""

    threads: int  # usable threads no guest owns
    whole_cores: int  # cores every online thread of which is free
    half_cores: int  # cores with some, not all, threads free
    usable: int  # usable pCPUs of the node
    pool: int  # shared pool (pCPUs floating vCPUs may use)
    shared_load: float  # floating vCPUs on the node
    memory_kib: Mapping[int, int]  # page size KiB -> free memory of that size
    capacity_kib: int  # the node's memory
    utilisation: float  # max(CPU, memory) share taken
    smt: int  # threads per core


@dataclass(frozen=True)
class HostRoom:
    """A host's free room, per node and summed."""

    nodes: tuple[NodeRoom, ...]  # nodes with usable pCPUs first, then memory-only nodes
    free_threads: int
    free_whole_cores: int
    memory_kib: Mapping[int, int]  # page size KiB -> free memory of that size, all nodes

    def memory_for(self, page_kib: int) -> int:
        return self.memory_kib.get(page_kib, 0)

    def rank_for(self, demand: Demand) -> tuple[float, int] | None:
        """`rank(demand, self)`, remembered: a room does not change, and guests of one kind ask alike."""
        ranks: dict[Demand, tuple[float, int] | None] = self.__dict__.setdefault("_ranks", {})
        if demand not in ranks:
            ranks[demand] = rank(demand, self)
        return ranks[demand]


@dataclass(frozen=True)
class Demand:
    """What a guest asks of a host, computed once per guest."""

    dedicated: int
    shared: int
    isolate: bool
    memory_kib: int
    pages: tuple[int, ...]  # page sizes it accepts on this host shape, best first
    cells: int  # NUMA cells it asks for (0: one if it fits a node)

    @classmethod
    def of(cls, spec: GuestSpec, pages: Sequence[int]) -> Demand:
        dedicated = len(spec.dedicated_vcpu_set)
        return cls(dedicated, spec.vcpus - dedicated, spec.effective_thread_policy == "isolate",
                   spec.memory_mib * 1024, tuple(pages), len(spec.numa_cells) or (spec.numa_nodes or 0))


def room_of(views: Mapping[int, NodeView], utilisation: Mapping[int, float],
            capacity_kib: Mapping[int, int]) -> HostRoom:
    """The room the allocator's node views show; `utilisation` per node as BalanceScorer's."""
    nodes = []
    memory: dict[int, int] = {}
    for node, view in sorted(views.items(), key=lambda item: (not item[1].has_cpus, item[0])):
        sizes = {SMALL_PAGE_KIB: view.small_free_kib,
                 **{size: pages * size for size, pages in view.huge_free.items()}}
        for size, kib in sizes.items():
            memory[size] = memory.get(size, 0) + kib
        whole = sum(1 for c in view.cores if c.whole)
        half = sum(1 for c in view.cores if c.free and not c.whole)
        nodes.append(NodeRoom(view.free_threads, whole, half, sum(len(c.core.cpus) for c in view.cores),
                              len(view.pool), view.shared_load, sizes, capacity_kib.get(node, 0),
                              utilisation.get(node, 0.0), view.smt))
    return HostRoom(tuple(nodes), sum(n.threads for n in nodes), sum(n.whole_cores for n in nodes), memory)


def host_room(topology: HostTopology, usage: HostUsage, options: AllocationOptions) -> HostRoom:
    """The room of a host in the state `usage` describes, kept with that usage (a usage that
    changes drops it), so a host whose state did not change is summed up once."""
    key = ("room", id(topology), options)
    cached = usage.derived.get(key)
    if cached is not None and cached[0] is topology:
        kept: HostRoom = cached[1]
        return kept
    views = node_views(topology, usage, options, "performance")
    room = room_of(views, {n: node_utilisation(usage, n) for n in views if views[n].has_cpus},
                   {n: info.memory_kib for n, info in topology.nodes.items()})
    usage.derived[key] = (topology, room)
    return room


def may_fit(demand: Demand, room: HostRoom) -> bool:
    """False only when the host surely cannot take the guest (a necessary condition): fewer free
    threads than dedicated vCPUs, fewer free whole cores than `isolate` vCPUs, or too little
    memory of every page size it accepts."""
    if room.free_threads < demand.dedicated:
        return False
    if demand.isolate and room.free_whole_cores < demand.dedicated:
        return False
    return any(room.memory_for(page) >= demand.memory_kib for page in demand.pages)


def _fits_node(demand: Demand, node: NodeRoom) -> bool:
    if node.usable == 0 or node.threads < demand.dedicated:
        return False
    if demand.isolate and node.whole_cores < demand.dedicated:
        return False
    if demand.shared and node.pool - (demand.dedicated if not demand.isolate else 2 * demand.dedicated) <= 0:
        return False
    return any(node.memory_kib.get(page, 0) >= demand.memory_kib for page in demand.pages)


def estimate(demand: Demand, room: HostRoom) -> float:
    """What the default scorer would give the guest's best placement on this host, estimated from
    the room alone (core/placement/scoring.py: locality 0.4, packing, siblings and balance 0.2 each): the
    guest on the node it fits whose utilisation after it leaves the nodes most even."""
    cpu_nodes = [n for n in room.nodes if n.usable]
    if not cpu_nodes:
        return 0.0
    fitting = [n for n in cpu_nodes if _fits_node(demand, n)] if demand.cells <= 1 else []
    if fitting:
        locality, landing = 1.0, fitting
    else:  # split over the least used nodes: locality suffers by the extra nodes
        cells = max(2, demand.cells)
        locality, landing = 1.0 / (1 + max(0, cells - max(1, demand.cells))), cpu_nodes
    best = 0.0
    for node in landing if fitting else landing[:1]:
        share = 1.0 / (1 if fitting else max(2, demand.cells))
        after = []
        for other in cpu_nodes:
            add = 0.0
            if other is node or not fitting:
                cpu = (demand.dedicated * (2 if demand.isolate else 1) + min(demand.shared, other.pool)) * share
                mem = demand.memory_kib * share / other.capacity_kib if other.capacity_kib else 0.0
                add = max(cpu / other.usable, mem)
            after.append(min(1.0, other.utilisation + add))
        balance = 1.0 - (max(after) - min(after)) if len(after) > 1 else 1.0
        packing = 1.0
        if demand.dedicated and not demand.isolate and demand.dedicated % 2 and node.half_cores == 0 \
                and node.threads > node.whole_cores:
            packing = 0.5
        # SiblingScorer: a dedicated vCPU whose sibling thread floats (the node has floating load)
        # or runs another guest's pinned vCPU counts fully; floating vCPUs by their pool's pressure
        penalty = 0.0
        if demand.dedicated and node.smt > 1:
            if node.shared_load > 0:
                penalty += demand.dedicated
            elif not demand.isolate and node.whole_cores * node.smt < demand.dedicated:
                penalty += demand.dedicated - node.whole_cores * node.smt
        if demand.shared:
            pressure = (node.shared_load + demand.shared) / max(1, node.pool) / 4.0
            penalty += demand.shared * min(1.0, pressure)
        siblings = 1.0 - penalty / max(1, demand.dedicated + demand.shared)
        best = max(best, 0.4 * locality + 0.2 * packing + 0.2 * siblings + 0.2 * balance)
    return best


def rank(demand: Demand, room: HostRoom) -> tuple[float, int] | None:
    """How promising the host is for the guest, smaller first (the highest estimate, then the
    tightest host), or None when it surely cannot take it. Depends on the demand and the room
    only, so callers keep it until the host's room changes."""
    if not may_fit(demand, room):
        return None
    return (-estimate(demand, room), room.free_threads)


def shortlist(ranked: Sequence[tuple[tuple[float, int], int, int]], limit: int) -> list[int]:
    """The hosts to allocate the guest on, from (rank, host index, shape) of each distinct host
    state that may take it: the most promising host of every shape (how a host is built weighs
    in the scorers as much as how full it is), then the most promising others up to `limit`
    hosts in all; returned in host order (ties between equal scores go to the first host)."""
    kept = sorted(ranked)
    chosen: list[int] = []
    shapes: set[int] = set()
    for _, at, shape in kept:
        if shape not in shapes:
            shapes.add(shape)
            chosen.append(at)
    taken = set(chosen)
    chosen += [at for _, at, _ in kept if at not in taken][:max(0, limit - len(chosen))]
    return sorted(chosen)
