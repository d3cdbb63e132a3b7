"""The placement engine: the best-scoring feasible Placement of a guest on a host, or NoFit.

Search, in three stages, so that it stays fast on big hosts (a 16-node host
and an 8-cell guest in about 10 ms, where enumerating the n!/(n−k)!
cell permutations as Nova's numa_fit_instance_to_host does takes minutes):

1. admission (placement/admit.py): every (guest cell, host node) pair is
   checked by counting free cores, threads, shared pool and memory;
2. node sets: one-cell guests try every admitted node; multi-cell guests
   grow node sets cell by cell in a beam ordered by NUMA distance, keeping
   the `beam_width` closest (with a matching search as a fallback, so a fit
   that exists is never missed);
3. each surviving candidate is built for real (CPU choice inside each node:
   whole nodes → whole cores → single threads) and scored; the best wins.

Semantics (docs/placement.md has the long form):
- dedicated vCPUs own one pCPU each; nobody else runs there;
- shared vCPUs float over their node's shared pool: usable pCPUs minus
  isolcpus and minus every pCPU someone owns. The pool shrinks as pinned
  guests arrive (`refresh_shared_pins` recomputes floating pins);
- isolate: one vCPU per core, the whole core owned (siblings idle);
- require: vCPUs packed on sibling threads of whole cores (needs SMT);
- prefer: whole cores for pairs of vCPUs, then single threads; packing into
  half-used cores and breaking fresh cores are both built and scored;
- latency-critical: dedicated + isolate whatever the cpu_policy says;
- reserved pCPUs are never used by vCPUs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.nofit import NoFit, NoFitReason
from vmplacer.core.placement.occupancy import SMALL_PAGE_KIB, HostUsage, Occupancy, exclusive_of, split_vcpus
from vmplacer.core.placement.guest_placement import GuestCell, Placement
from vmplacer.core.placement.admit import (
    AllocationOptions,
    CellRequest,
    CoreView,
    NodeView,
    admit_cell,
    admit_memory_nodes,
    node_views,
    cell_requests,
    minimum_cells,
    page_options,
)
from vmplacer.core.placement.scoring import AffinityScorer, Scorer, WeightedScorer, default_scorer
from vmplacer.core.topology.host import HostTopology

__all__ = ["AllocationOptions", "NoFit", "NoFitReason", "allocate", "place_on_nodes", "refresh_shared_pins"]

AFFINITY_WEIGHT = 0.1


@dataclass(frozen=True)
class CellFill:
    """The pCPUs chosen for a cell's dedicated vCPUs (in vCPU order) and what it now owns."""

    cpus: tuple[int, ...]
    exclusive: frozenset[int]


def allocate(
    topology: HostTopology,
    guest: GuestSpec,
    others: Sequence[Placement] = (),
    *,
    scorer: Scorer | None = None,
    options: AllocationOptions | None = None,
    anti_affinity_of_others: Mapping[str, Sequence[str]] | None = None,
    candidates: list[Placement] | None = None,
) -> Placement:
    """Place `guest` on `topology` next to `others`; the best-scoring Placement or NoFit.

    `anti_affinity_of_others` maps a placed guest to the guests it refuses to
    share a node with, so anti-affinity holds whichever side declared it.
    `candidates`, when given, receives every candidate built, with its score
    (to explain a choice).
    """
    options = options or AllocationOptions()
    occupancy = others if isinstance(others, Occupancy) else Occupancy(others)
    usage = occupancy.usage(topology)
    scorer = scorer or default_scorer()
    if guest.affinity:
        scorer = _with_affinity(scorer, guest.affinity)
    if guest.name in usage.guest_nodes:
        raise NoFit(guest.name, topology.name, [NoFitReason(
            "name", "host", "a name not yet used on the host", f"guest {guest.name} already placed")])
    search = _Search(topology, guest, occupancy, usage, scorer, options, anti_affinity_of_others or {})
    search.trace = candidates
    return search.run()


def place_on_nodes(
    topology: HostTopology,
    guest: GuestSpec,
    nodes: Sequence[int],
    others: Sequence[Placement] = (),
    *,
    scorer: Scorer | None = None,
    options: AllocationOptions | None = None,
) -> Placement:
    """The guest with cell i on host node `nodes[i]`, built and scored as `allocate` would.

    For what-if questions ("what if it went there?") and for comparing search
    strategies on equal terms; NoFit when the cells do not fit those nodes.
    """
    options = options or AllocationOptions()
    occupancy = others if isinstance(others, Occupancy) else Occupancy(others)
    search = _Search(topology, guest, occupancy, occupancy.usage(topology), scorer or default_scorer(),
                     options, {})
    cells = cell_requests(guest, len(nodes), topology)
    memory_pages, memory_reasons = admit_memory_nodes(topology, search.views, cells, search.pages)
    search.reasons.extend(memory_reasons)
    pages: set[int] = set(memory_pages)
    for cell, node in zip(cells, nodes):
        view = search.views.get(node)
        if view is None:
            raise NoFit(guest.name, topology.name, [NoFitReason("node", f"node {node}", "an existing node", "none")])
        fitting, reasons = admit_cell(view, cell, search.pages, options)
        search.reasons.extend(reasons)
        pages &= set(fitting)
    if len(set(nodes)) != len(nodes) or not pages or search.reasons:
        raise NoFit(guest.name, topology.name, search.reasons or [NoFitReason(
            "numa-cells", "host", "one distinct node per cell with a common page size", f"nodes {list(nodes)}")])
    ordered = tuple(p for p in search.pages if p in pages)
    best = max(search._build(cells, tuple(nodes), ordered), key=lambda p: p.score, default=None)
    if best is None:
        raise NoFit(guest.name, topology.name, search.reasons)
    return best


def _with_affinity(scorer: Scorer, peers: tuple[str, ...]) -> Scorer:
    if isinstance(scorer, WeightedScorer):
        total = sum(w for w, _ in scorer.parts)
        return scorer.plus(AFFINITY_WEIGHT * total, AffinityScorer(peers))
    return WeightedScorer(((1.0, scorer), (AFFINITY_WEIGHT, AffinityScorer(peers))))


# How one cell's CPUs are filled: a named order, or ("anchor", i) around the i-th anchor core.
_Variant = str | tuple[str, int]


class _Search:
    """One allocation: the state shared by the stages (views, admitted pairs, memo of fills)."""

    def __init__(self, topology: HostTopology, guest: GuestSpec, occupancy: Occupancy,
                 usage: HostUsage, scorer: Scorer, options: AllocationOptions,
                 anti_of_others: Mapping[str, Sequence[str]]):
        self.topology = topology
        self.guest = guest
        self.occupancy = occupancy
        self.usage = usage
        self.scorer = scorer
        self.options = options
        self.prefer_kind = "efficiency" if guest.workload_class == "batch" else "performance"
        self.views = node_views(topology, usage, options, self.prefer_kind)
        self.pages = page_options(guest, topology)
        self.reasons: list[NoFitReason] = []
        self.banned = self._anti_affinity(anti_of_others)
        self._fills: dict[tuple[int, str, int, _Variant], CellFill | NoFitReason] = {}
        self.alternatives = int(getattr(scorer, "alternatives", 0) or 0)
        self.trace: list[Placement] | None = None
        nodes = sorted(self.views)
        self.distance = {(a, b): topology.distance(a, b) for a in nodes for b in nodes}

    # ----- top level ----------------------------------------------------------------------
    def run(self) -> Placement:
        guest = self.guest
        cpu_nodes = [n for n in self.views if self.views[n].has_cpus]
        most = max(1, min(len(cpu_nodes), guest.vcpus))
        oversize: list[NoFitReason] = []
        if guest.numa_cells or guest.numa_nodes:
            counts = [len(guest.numa_cells) or guest.numa_nodes or 1]
            if counts[0] > len(cpu_nodes):
                raise NoFit(guest.name, self.topology.name, [NoFitReason(
                    "numa-cells", "host", f"{counts[0]} nodes with CPUs (one per guest cell)", f"{len(cpu_nodes)}")])
        else:
            first = minimum_cells(guest, self.topology, self.options)
            if first == 1:
                counts = [1]  # locality first: a guest that fits one node's capacity is never split
            elif first <= most:
                counts = list(range(first, most + 1))
            else:
                # Bigger than the whole host can hold even spread over every node: try
                # that, so the reasons name the nodes and amounts that fall short.
                counts = [most]
                oversize.append(NoFitReason(
                    "numa-cells", "host", f"{first} nodes' worth of capacity (the guest is bigger than any node)",
                    f"{len(cpu_nodes)} nodes with CPUs"))
        first_failure: NoFit | None = None
        for count in counts:
            self.reasons = []
            try:
                return self._place(cell_requests(guest, count, self.topology))
            except NoFit as failure:
                first_failure = first_failure or failure
        assert first_failure is not None
        if oversize:
            raise NoFit(guest.name, self.topology.name, [*oversize, *first_failure.reasons])
        raise first_failure

    def _anti_affinity(self, anti_of_others: Mapping[str, Sequence[str]]) -> dict[int, list[str]]:
        """Nodes the guest must avoid, with the guests that hold them."""
        peers = set(self.guest.anti_affinity)
        peers |= {other for other, refused in anti_of_others.items() if self.guest.name in refused}
        banned: dict[int, list[str]] = {}
        for peer in sorted(peers):
            for node in self.usage.guest_nodes.get(peer, ()):
                banned.setdefault(node, []).append(peer)
        return banned

    # ----- stage 1: admission ----------------------------------------------------------------
    def _memory_node_pages(self, cells: tuple[CellRequest, ...]) -> tuple[int, ...]:
        """Page sizes the named memory-only nodes can give (all when none is named); NoFit if none.

        A named node held by an anti-affine peer is refused as a CPU node would be.
        """
        reasons: list[NoFitReason] = []
        for node in sorted({c.memory_node for c in cells if c.memory_node is not None} & set(self.banned)):
            reasons.append(NoFitReason(
                "anti-affinity", f"memory_node {node}", "a node without " + ", ".join(self.banned[node]),
                f"node {node} holds {', '.join(self.banned[node])}"))
        pages, memory_reasons = admit_memory_nodes(self.topology, self.views, cells, self.pages)
        reasons.extend(memory_reasons)
        if reasons:
            self.reasons.extend(reasons)
            raise NoFit(self.guest.name, self.topology.name, self.reasons)
        return pages

    def _admitted(self, cells: tuple[CellRequest, ...], pages: tuple[int, ...]) -> list[dict[int, tuple[int, ...]]]:
        """Per cell: node -> page sizes that fit. Records a reason for every refusal."""
        by_signature: dict[tuple[int, int, int, str, int, int], dict[int, tuple[int, ...]]] = {}
        admitted = []
        for cell in cells:
            key = cell.signature
            if key not in by_signature:
                fits: dict[int, tuple[int, ...]] = {}
                for node, view in sorted(self.views.items()):
                    if not view.has_cpus:
                        continue
                    if node in self.banned:
                        self.reasons.append(NoFitReason(
                            "anti-affinity", f"node {node}", "a node without " + ", ".join(self.banned[node]),
                            f"node {node} holds {', '.join(self.banned[node])}"))
                        continue
                    node_pages, reasons = admit_cell(view, cell, pages, self.options)
                    if node_pages:
                        fits[node] = node_pages
                    else:
                        self.reasons.extend(reasons)
                by_signature[key] = fits
            admitted.append(by_signature[key])
        return admitted

    # ----- stage 2: candidate node assignments -----------------------------------------------------
    def _place(self, cells: tuple[CellRequest, ...]) -> Placement:
        admitted = self._admitted(cells, self._memory_node_pages(cells))
        if any(not fits for fits in admitted):
            raise NoFit(self.guest.name, self.topology.name, self.reasons)
        if len(cells) == 1:
            candidates: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
                ((node,), pages) for node, pages in admitted[0].items()]
        else:
            candidates = self._beam(cells, admitted)
            if not candidates:
                candidates = self._matching(cells, admitted)
            if not candidates:
                usable = sorted({n for fits in admitted for n in fits})
                self.reasons.append(NoFitReason(
                    "numa-cells", "host", f"{len(cells)} distinct nodes, each fitting one guest cell",
                    f"nodes {usable} fit some cell" if usable else "none"))
                raise NoFit(self.guest.name, self.topology.name, self.reasons)
        if any(cell.memory_node is not None for cell in cells):
            candidates = self._nearest_to_memory(cells, candidates)
        best: Placement | None = None
        for nodes, pages in candidates:
            for placement in self._build(cells, nodes, pages):
                if best is None or (placement.score, self._tiebreak(placement)) > (best.score, self._tiebreak(best)):
                    best = placement
        if best is None:
            raise NoFit(self.guest.name, self.topology.name, self.reasons)
        return best

    def _memory_distance(self, cell: CellRequest, node: int) -> int:
        """NUMA distance from a cell's vCPUs (on `node`) to the memory-only node holding its memory."""
        if cell.memory_node is None:
            return 0
        return self.distance.get((node, cell.memory_node)) or self.topology.distance(node, cell.memory_node)

    def _nearest_to_memory(self, cells: tuple[CellRequest, ...],
                           candidates: list[tuple[tuple[int, ...], tuple[int, ...]]]
                           ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Candidates whose vCPUs sit closest to their named memory nodes (locality first, as for
        CPU nodes: a CXL or HBM node attached to one socket serves that socket's vCPUs)."""
        def cost(nodes: tuple[int, ...]) -> int:
            return sum(self._memory_distance(cell, node) for cell, node in zip(cells, nodes))
        least = min(cost(nodes) for nodes, _ in candidates)
        return [(nodes, pages) for nodes, pages in candidates if cost(nodes) == least]

    def _beam(self, cells: tuple[CellRequest, ...], admitted: list[dict[int, tuple[int, ...]]]
              ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Grow node sets cell by cell, most constrained cell first, keeping the closest sets.

        Cost = sum of NUMA distances between the chosen nodes; ties go to the
        emptier nodes (more free threads), which keeps nodes balanced.
        """
        order = sorted(range(len(cells)), key=lambda i: (len(admitted[i]), -len(cells[i].vcpus), i))
        signatures = [cell.signature for cell in cells]
        uniform = len(set(signatures)) == 1
        free = {n: v.free_threads for n, v in self.views.items()}
        distance = self.distance
        # A state: (distance sum, free threads of its nodes, sorted nodes, cell -> node, pages in common).
        State = tuple[float, int, tuple[int, ...], dict[int, int], frozenset[int]]
        states: list[State] = [(0.0, 0, (), {}, frozenset(self.pages))]
        width = max(self.options.beam_width, 1)
        for index in order:
            grown: dict[object, State] = {}
            for cost, spare, used, chosen, pages in states:
                for node, node_pages in admitted[index].items():
                    if node in chosen.values():
                        continue
                    common = pages.intersection(node_pages)
                    if not common:
                        continue
                    new_cost = cost + sum(distance[(node, u)] for u in used) + self._memory_distance(
                        cells[index], node)
                    new_spare = spare + free[node]
                    nodes = tuple(sorted((*used, node)))
                    # Cells with equal signatures are interchangeable: one state per node multiset.
                    key: Hashable = nodes
                    if not uniform:
                        key = tuple(sorted((signatures[i], n) for i, n in (*chosen.items(), (index, node))))
                    known = grown.get(key)
                    if known is None or (new_cost, -new_spare) < (known[0], -known[1]):
                        grown[key] = (new_cost, new_spare, nodes, {**chosen, index: node}, common)
            states = sorted(grown.values(), key=lambda s: (s[0], -s[1], s[2]))[:width]
            if not states:
                return []
        result = []
        for _, _, _, assignment, pages in states:
            nodes = tuple(assignment[i] for i in range(len(cells)))
            result.append((nodes, tuple(p for p in self.pages if p in pages)))
        return result

    def _matching(self, cells: tuple[CellRequest, ...], admitted: list[dict[int, tuple[int, ...]]]
                  ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Any assignment of cells to distinct nodes (augmenting paths), per page size."""
        for page in self.pages:
            options = [[n for n, pages in fits.items() if page in pages] for fits in admitted]
            owner: dict[int, int] = {}

            def augment(cell: int, seen: set[int]) -> bool:
                for node in options[cell]:
                    if node in seen:
                        continue
                    seen.add(node)
                    if node not in owner or augment(owner[node], seen):
                        owner[node] = cell
                        return True
                return False

            if all(augment(i, set()) for i in range(len(cells))):
                nodes = {cell: node for node, cell in owner.items()}
                return [(tuple(nodes[i] for i in range(len(cells))), (page,))]
        return []

    # ----- stage 3: build and score a candidate ------------------------------------------------------
    def _build(self, cells: tuple[CellRequest, ...], nodes: tuple[int, ...], pages: tuple[int, ...]
               ) -> Iterator[Placement]:
        """Yield the placements of one node assignment (one per fill variant that works)."""
        page = pages[0]  # best page size every chosen node can give
        variants: tuple[_Variant, ...] = ("cores-first", "holes-first") if any(
            c.dedicated and c.thread_policy == "prefer" for c in cells) else ("cores-first",)
        if self.alternatives and any(c.dedicated for c in cells):
            # A scorer that can tell cores apart (the interference model) gets more to choose from.
            variants += tuple(("anchor", i) for i in range(self.alternatives))
        seen: set[tuple[tuple[int, ...], ...]] = set()
        for variant in variants:
            fills: list[CellFill] = []
            failed = False
            for cell, node in zip(cells, nodes):
                fill = self._fill(cell, node, variant)
                if isinstance(fill, NoFitReason):
                    if not isinstance(variant, tuple):  # an extra candidate that fails explains nothing
                        self.reasons.append(fill)
                    failed = True
                    break
                fills.append(fill)
            if failed:
                continue
            key = tuple(f.cpus for f in fills)
            if key in seen:
                continue
            seen.add(key)
            placement = self._assemble(cells, nodes, fills, page)
            if placement is not None:
                score = self.scorer.score(self.topology, placement, self.occupancy)
                placement = _replace_score(placement, score)
                if self.trace is not None:
                    self.trace.append(placement)
                yield placement

    def _tiebreak(self, placement: Placement) -> tuple[int, ...]:
        """Equal scores: pCPUs of the preferred kind on hybrid hosts (performance cores for
        latency, efficiency cores for batch), then lower node and pCPU ids (reproducible plans)."""
        cpus = self.topology.cpus
        kind = sum(1 for c in placement.pcpus if cpus[c].kind == self.prefer_kind)
        return (kind, *(-n for n in sorted(placement.memory_nodes)), *(-c for c in sorted(placement.pcpus)[:8]))

    def _fill(self, cell: CellRequest, node: int, variant: _Variant) -> CellFill | NoFitReason:
        key = (len(cell.dedicated), cell.thread_policy, node, variant)
        if key not in self._fills:
            where = f"cell {cell.id} on node {node}"
            if isinstance(variant, tuple):
                anchors = anchor_cores(self.views[node], self.alternatives)
                anchor = anchors[variant[1]] if variant[1] < len(anchors) else None
                self._fills[key] = (fill_anchored(self.views[node], len(cell.dedicated), cell.thread_policy,
                                                  anchor, where) if anchor is not None else
                                    NoFitReason("anchor", where, "another free core to start from", "none"))
            else:
                self._fills[key] = fill_dedicated(self.views[node], len(cell.dedicated), cell.thread_policy,
                                                  variant, where)
        return self._fills[key]

    def _assemble(self, cells: tuple[CellRequest, ...], nodes: tuple[int, ...],
                  fills: list[CellFill], page: int) -> Placement | None:
        guest, usage, topo = self.guest, self.usage, self.topology
        exclusive: set[int] = set()
        for fill in fills:
            exclusive |= fill.exclusive
        emulator: frozenset[int] = frozenset()
        if guest.emulator_threads == "isolate":
            cpu = pick_single_thread(self.views[nodes[0]], exclusive)
            if cpu is None:
                self.reasons.append(NoFitReason("emulator-cpu", f"node {nodes[0]}",
                                                "1 free pCPU for the isolated emulator thread", "0"))
                return None
            exclusive.add(cpu)
            emulator = frozenset({cpu})
        vcpupin: dict[int, frozenset[int]] = {}
        pools: dict[int, frozenset[int]] = {}
        for cell, node, fill in zip(cells, nodes, fills):
            for vcpu, cpu in zip(cell.dedicated, fill.cpus):
                vcpupin[vcpu] = frozenset({cpu})
            pool = usage.shared_pool(node) - exclusive
            pools[node] = pool
            load = usage.shared_load.get(node, 0.0) + len(cell.shared)
            if load > 0 and (not pool or len(pool) * self.options.cpu_allocation_ratio < load):
                self.reasons.append(NoFitReason(
                    "shared-pool", f"cell {cell.id} on node {node}",
                    f"{load:g} floating vCPUs at ratio {self.options.cpu_allocation_ratio:g}",
                    f"{len(pool)} shared pCPUs left"))
                return None
            for vcpu in cell.shared:
                vcpupin[vcpu] = pool
        dedicated = all(len(c.shared) == 0 for c in cells)
        if not emulator:
            if self.options.emulator_cpus:
                emulator = self.options.emulator_cpus
            elif dedicated:
                emulator = frozenset(c for f in fills for c in f.cpus)
            else:
                emulator = frozenset().union(*(pools[n] for n in nodes))
        hugepage = page if page > SMALL_PAGE_KIB else None
        return Placement(
            guest=guest.name,
            host=topo.name,
            vcpupin=dict(sorted(vcpupin.items())),
            emulatorpin=emulator,
            memory_nodes=frozenset(n if c.memory_node is None else c.memory_node for c, n in zip(cells, nodes)),
            mem_mode=guest.mem_mode,
            cells=tuple(GuestCell(c.id, frozenset(c.vcpus), c.memory_kib, n, c.memory_node)
                        for c, n in zip(cells, nodes)),
            memory_kib=guest.memory_mib * 1024,
            hugepage_kib=hugepage,
            threads_per_core=_guest_threads(topo, cells, vcpupin, dedicated),
            dedicated=dedicated,
            exclusive_cpus=frozenset(exclusive),
        )


def _replace_score(placement: Placement, score: float) -> Placement:
    return replace(placement, score=round(score, 6))


def _guest_threads(topology: HostTopology, cells: tuple[CellRequest, ...],
                   vcpupin: dict[int, frozenset[int]], dedicated: bool) -> int:
    """2 (the host's SMT width) when every group of consecutive vCPUs sits on one core's siblings.

    Mirrors the host so the guest kernel schedules knowing which vCPUs share a core.
    """
    smt = topology.smt
    if smt < 2 or not dedicated:
        return 1
    for cell in cells:
        if len(cell.vcpus) % smt:
            return 1
        for start in range(0, len(cell.vcpus), smt):
            group = cell.vcpus[start:start + smt]
            cpus = [next(iter(vcpupin[v])) for v in group]
            if len({topology.cpus[c].core for c in cpus}) != 1 or len(set(cpus)) != smt:
                return 1
    return smt


# ----- CPU choice inside one node --------------------------------------------------------------------
def choose_cores(cores: list[CoreView], count: int) -> list[CoreView]:
    """`count` cores, inside one LLC when one can hold them all (the tightest such LLC),
    else inside one die when one can (the tightest such die: on multi-die packages
    crossing dies costs more than crossing LLCs of one die), else from the largest
    LLC groups first — fewer cache domains per guest."""
    if count <= 0:
        return []
    groups: dict[int | None, list[CoreView]] = {}
    for core in cores:
        groups.setdefault(core.llc, []).append(core)
    fitting = [g for g in groups.values() if len(g) >= count]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0].rank))
        return best[:count]
    dies: dict[int, list[CoreView]] = {}
    for core in cores:
        dies.setdefault(core.core.die, []).append(core)
    roomy = [d for d in dies.values() if len(d) >= count]
    if len(dies) > 1 and roomy:
        return choose_cores(min(roomy, key=lambda d: (len(d), d[0].rank)), count)
    chosen: list[CoreView] = []
    for group in sorted(groups.values(), key=lambda g: (-len(g), g[0].rank)):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


def fill_dedicated(view: NodeView, wanted: int, policy: str, variant: str, where: str) -> CellFill | NoFitReason:
    """pCPUs for `wanted` dedicated vCPUs on one node, in the order vCPUs take them.

    Fills in the order of the ARCHITECTURE rule: whole nodes → whole cores → single threads.
    """
    if wanted == 0:
        return CellFill((), frozenset())
    free_threads = [t for core in view.cores for t in core.free]

    # Whole node: the cell takes everything left on the node, so there is no choice to make.
    if policy == "prefer" and wanted == len(free_threads):
        return CellFill(tuple(free_threads), frozenset(free_threads))
    whole = view.whole_cores
    if policy == "isolate" and wanted == len(whole) and len(whole) == len(view.cores):
        return CellFill(tuple(c.free[0] for c in whole), frozenset(t for c in whole for t in c.free))

    # Whole cores: isolate = one vCPU per core, the core owned; require = vCPUs on sibling
    # threads of owned cores; prefer = pairs of vCPUs on whole cores (cores-first variant).
    if policy == "isolate":
        if len(whole) < wanted:
            return NoFitReason("whole-cores", where, f"{wanted} free whole cores", f"{len(whole)}")
        chosen = choose_cores(whole, wanted)
        return CellFill(tuple(c.free[0] for c in chosen), frozenset(t for c in chosen for t in c.free))
    if policy == "require":
        pairs = [c for c in whole if len(c.free) >= 2]
        per_core = max((len(c.free) for c in pairs), default=2)
        chosen = choose_cores(pairs, math.ceil(wanted / per_core))
        threads = [t for c in chosen for t in c.free]
        if len(threads) < wanted:
            return NoFitReason("sibling-pairs", where, f"{math.ceil(wanted / per_core)} free whole SMT cores",
                               f"{len(pairs)}")
        return CellFill(tuple(threads[:wanted]), frozenset(threads))

    smt = view.smt
    cpus: list[int] = []
    taken_cores: set[int] = set()
    if variant == "cores-first" and smt > 1:
        full = [c for c in whole if len(c.free) == smt]
        for core in choose_cores(full, min(wanted // smt, len(full))):
            cpus.extend(core.free)
            taken_cores.add(core.core.id)

    # Single threads: first the free threads of half-used cores (keeps whole cores whole),
    # in the LLC already used; then whole cores, thread after thread so siblings pair up.
    llcs = {c.llc for c in view.cores if c.core.id in taken_cores}
    partial = [c for c in view.cores if not c.whole and c.free]
    fresh = [c for c in view.cores if c.whole and c.core.id not in taken_cores]
    partial.sort(key=lambda c: (c.llc not in llcs, c.rank))
    fresh.sort(key=lambda c: (c.llc not in llcs, c.rank))
    for core in partial + fresh:
        for thread in core.free:
            if len(cpus) == wanted:
                break
            cpus.append(thread)
        if len(cpus) == wanted:
            break
    if len(cpus) < wanted:
        return NoFitReason("dedicated-cpus", where, f"{wanted} free pCPUs", f"{len(free_threads)}")
    return CellFill(tuple(cpus), frozenset(cpus))


def anchor_cores(view: NodeView, limit: int) -> list[CoreView]:
    """Up to `limit` cores with free threads to start extra candidates from, spread over the
    node's LLCs (round robin, half-used cores first in each), so a small limit still shows
    every cache domain."""
    by_llc: dict[int | None, list[CoreView]] = {}
    for core in sorted((c for c in view.cores if c.free), key=lambda c: (c.whole, c.rank)):
        by_llc.setdefault(core.llc, []).append(core)
    groups = sorted(by_llc.values(), key=lambda g: g[0].rank)
    result: list[CoreView] = []
    depth = 0
    while len(result) < limit and any(depth < len(g) for g in groups):
        result.extend(g[depth] for g in groups if depth < len(g))
        depth += 1
    return result[:limit]


def fill_anchored(view: NodeView, wanted: int, policy: str, anchor: CoreView, where: str) -> CellFill | NoFitReason:
    """Like `fill_dedicated`, but starting from `anchor`: its threads first (isolate/require:
    the anchor whole core first), then the usual order, cores in the anchor's LLC first."""
    if wanted == 0:
        return CellFill((), frozenset())
    rest = [c for c in view.cores if c is not anchor]
    rest.sort(key=lambda c: (c.llc != anchor.llc, c.rank))
    if policy in ("isolate", "require"):
        per_core = 1 if policy == "isolate" else max(2, len(anchor.free))
        if not anchor.whole or len(anchor.free) < (1 if policy == "isolate" else 2):
            return NoFitReason("anchor", where, "a free whole core to start from", f"core {anchor.core.id}")
        pool = [c for c in rest if c.whole and (policy == "isolate" or len(c.free) >= 2)]
        cores = [anchor, *pool][: math.ceil(wanted / per_core)]
        threads = ([c.free[0] for c in cores] if policy == "isolate" else [t for c in cores for t in c.free])
        if len(threads) < wanted:
            return NoFitReason("anchor", where, f"{wanted} vCPUs on whole cores from core {anchor.core.id}",
                               f"{len(threads)}")
        owned = frozenset(t for c in cores for t in c.free)
        return CellFill(tuple(threads[:wanted]), owned)
    cpus = list(anchor.free[:wanted])
    partial = [c for c in rest if not c.whole and c.free]
    fresh = [c for c in rest if c.whole]
    for core in partial + fresh:
        if len(cpus) == wanted:
            break
        cpus.extend(core.free[: wanted - len(cpus)])
    if len(cpus) < wanted:
        return NoFitReason("dedicated-cpus", where, f"{wanted} free pCPUs", f"{view.free_threads}")
    return CellFill(tuple(cpus), frozenset(cpus))


def pick_single_thread(view: NodeView, taken: set[int]) -> int | None:
    """One free pCPU (for an isolated emulator thread): a half-used core's thread first."""
    partial = [c for c in view.cores if not c.whole]
    whole = [c for c in view.cores if c.whole]
    for core in partial + whole:
        if any(t in taken for t in core.free) and core.whole:
            continue  # a core this guest owns whole stays idle on its other threads
        for thread in core.free:
            if thread not in taken:
                return thread
    return None


# ----- keeping floating pins current ------------------------------------------------------------------
def refresh_shared_pins(topology: HostTopology, placements: Sequence[Placement]) -> list[Placement]:
    """Floating vCPUs and emulator threads taken off pCPUs that others now own (core/placement/isolation.py).

    Pinned guests take pCPUs out of the shared pool; a guest placed before
    them still lists those pCPUs. As with the kubelet's shared pool, floating
    pins are recomputed from the current owners: each floating vCPU keeps its
    pins minus what others own or the host reserves (never widened here;
    growing pools back is the rebalancer's call). A vCPU left with nothing,
    or one that floated anywhere (empty pins) while pCPUs are owned, gets the
    shared pool of its nodes. Emulator threads follow: off others' pCPUs, and
    one that ran anywhere floats with the guest's floating vCPUs (or on the
    guest's own pCPUs if it has none). Placements that do not change are
    returned as they are.
    """
    usage = HostUsage.build(topology, placements)
    index = usage.index
    all_nodes = [n for n, cpus in index.node_cpus.items() if cpus]
    result = []
    for placement in placements:
        own = exclusive_of(placement)
        others = usage.exclusive - own  # owned by someone else
        taken = others | (topology.reserved - own)
        _, shared = split_vcpus(placement)
        if not taken or not (shared or others):
            result.append(placement)
            continue
        pins = dict(placement.vcpupin)
        for vcpu, cpus in shared.items():
            if cpus and not cpus & taken:
                continue
            narrowed = cpus - taken
            if not narrowed:
                nodes = {index.cpu_node[c] for c in cpus if c in index.cpu_node} or all_nodes
                narrowed = frozenset().union(*(usage.shared_pool(n) for n in nodes)) - own - taken
            if narrowed:
                pins[vcpu] = narrowed
        emulator = _emulator_off(placement.emulatorpin, others, taken, pins, own)
        if pins != placement.vcpupin or emulator != placement.emulatorpin:
            placement = replace(placement, vcpupin=pins, emulatorpin=emulator)
        result.append(placement)
    return result


def _emulator_off(emulator: frozenset[int], others: frozenset[int] | set[int], taken: frozenset[int] | set[int],
                  pins: Mapping[int, frozenset[int]], own: frozenset[int]) -> frozenset[int]:
    """The emulator cpuset kept off pCPUs `others` own: what is left of it, else where the guest's
    floating vCPUs run, else the guest's own pCPUs. An empty set (anywhere) is given that place
    as soon as anything is owned or reserved; a set on reserved pCPUs stays (`emulator_cpus`)."""
    if emulator and not emulator & others:
        return emulator
    left = emulator - others
    if left:
        return left
    floating = frozenset().union(*(cpus for cpus in pins.values() if not cpus <= own)) - taken
    return floating or own or emulator


def may_narrow(placements: Sequence[Placement], reserved: frozenset[int] = frozenset()) -> bool:
    """False only when `refresh_shared_pins` would return every placement unchanged: no
    floating vCPU or emulator thread uses (or may use: empty pins) a pCPU someone else
    owns or the host reserves. Placing checks this on every placement; it costs a pass
    over the pins instead of building the host's usage."""
    owned = [exclusive_of(p) for p in placements]
    exclusive = frozenset().union(*owned)
    if not exclusive and not reserved:
        return False
    for placement, own in zip(placements, owned):
        others = exclusive - own
        taken = others | (reserved - own)
        if not taken:
            continue
        if not placement.emulatorpin or placement.emulatorpin & others:
            return True
        for cpus in split_vcpus(placement)[1].values():
            if not cpus or cpus & taken:
                return True
    return False


def owners_disjoint(placements: Sequence[Placement]) -> list[str]:
    """Problems where a pCPU owned by one guest is used by another (empty list = consistent)."""
    problems = []
    for a, b in combinations(placements, 2):
        for owner, user in ((a, b), (b, a)):
            clash = exclusive_of(owner) & (user.pcpus | exclusive_of(user))
            if clash:
                problems.append(f"{owner.guest} owns pCPUs {sorted(clash)} also used by {user.guest}")
    return problems
