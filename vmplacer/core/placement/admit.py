"""Admission: may this guest cell go on this host node at all? (hard constraints only)

Turns a GuestSpec into per-cell requests, summarises each host node's free
resources once (`NodeView`), and checks a cell against a node by counting —
cheap enough to run for every (cell, node) pair before the allocator builds
and scores real candidates. Every failed check is a `NoFitReason`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from vmplacer.core.topology.cpuset import format_cpuset
from vmplacer.core.placement.guest import GuestSpec
from vmplacer.core.placement.nofit import NoFitReason
from vmplacer.core.placement.occupancy import SMALL_PAGE_KIB, HostUsage
from vmplacer.core.topology.host import Core, HostTopology

KIND_ORDER = {"performance": 0, None: 1, "efficiency": 2}


@dataclass(frozen=True)
class AllocationOptions:
    """Host-level knobs of the allocator (from configuration, never globals)."""

    cpu_allocation_ratio: float = 4.0  # floating vCPUs per shared-pool pCPU
    emulator_cpus: frozenset[int] = frozenset()  # where 'share' emulator threads of pinned guests go
    reserved_memory_mib_per_node: int = 0  # kept for the host on every node
    beam_width: int = 16  # node sets kept per step of the multi-cell search


@dataclass(frozen=True)
class CellRequest:
    """One guest cell to place on one host node."""

    id: int
    vcpus: tuple[int, ...]
    dedicated: tuple[int, ...]  # vCPUs pinned 1:1 to pCPUs of their own
    shared: tuple[int, ...]  # vCPUs floating over the node's shared pool
    memory_kib: int
    thread_policy: str
    emulator_extra: int = 0  # 1 when the isolated emulator thread goes with this cell
    memory_node: int | None = None  # memory-only host node named for this cell's memory

    @property
    def signature(self) -> tuple[int, int, int, str, int, int]:
        """Cells with equal signatures are interchangeable for admission and CPU choice."""
        memory_node = -1 if self.memory_node is None else self.memory_node  # sortable
        return (len(self.dedicated), len(self.shared), self.memory_kib, self.thread_policy, self.emulator_extra,
                memory_node)


@dataclass
class CoreView:
    core: Core
    free: tuple[int, ...]  # online, usable, unowned threads
    whole: bool  # every online thread is free (the core can be taken whole)
    llc: int | None
    rank: tuple[int, int]  # preference order inside a node


@dataclass
class NodeView:
    """One host node's free resources, computed once per allocation."""

    node: int
    cores: list[CoreView]
    pool: frozenset[int]  # shared pool now
    free_isolated: int  # free isolcpus threads (usable by pinned vCPUs only)
    shared_load: float
    small_free_kib: int
    huge_free: dict[int, int]  # page size KiB -> free pages
    smt: int

    @property
    def has_cpus(self) -> bool:
        return bool(self.cores)

    @property
    def whole_cores(self) -> list[CoreView]:
        return [c for c in self.cores if c.whole]

    @property
    def free_threads(self) -> int:
        return sum(len(c.free) for c in self.cores)


def node_views(topology: HostTopology, usage: HostUsage, options: AllocationOptions,
               prefer_kind: str | None = None) -> dict[int, NodeView]:
    """`build_node_views`, built once per usage, topology and knobs: every guest tried on a host
    in the same state (a fleet's host choice tries many) reads the same views. Views are never
    modified; a usage that changes (`add`) drops them."""
    key = ("node_views", id(topology), options, prefer_kind)
    cached = usage.derived.get(key)
    if cached is not None and cached[0] is topology:
        kept: dict[int, NodeView] = cached[1]
        return kept
    views = build_node_views(topology, usage, options, prefer_kind)
    usage.derived[key] = (topology, views)
    return views


def build_node_views(topology: HostTopology, usage: HostUsage, options: AllocationOptions,
                     prefer_kind: str | None = None) -> dict[int, NodeView]:
    """Free cores/threads, shared pool and memory of every node, in preference order."""
    usable, owned = topology.usable_cpus, usage.exclusive
    reserved_kib = options.reserved_memory_mib_per_node * 1024
    cores_by_node: dict[int, list[CoreView]] = {n: [] for n in topology.nodes}
    for core in topology.cores:
        online = [c for c in core.cpus if topology.cpus[c].online]
        if not online:
            continue
        free = tuple(c for c in online if c in usable and c not in owned)
        kind = topology.cpus[online[0]].kind
        kind_rank = KIND_ORDER.get(kind, 1)
        if prefer_kind == "efficiency":
            kind_rank = 2 - kind_rank
        cores_by_node.setdefault(core.node, []).append(CoreView(
            core=core, free=free, whole=bool(free) and len(free) == len(online),
            llc=topology.cpus[online[0]].llc, rank=(kind_rank, online[0]),
        ))
    views: dict[int, NodeView] = {}
    for node, info in topology.nodes.items():
        cores = sorted(cores_by_node.get(node, []), key=lambda c: c.rank)
        pool = usage.shared_pool(node)
        isolated = sum(1 for c in cores for t in c.free if t in topology.isolated)
        huge = {p.size_kib: usage.huge_free_pages(node, p.size_kib)
                for p in info.hugepages if p.size_kib > SMALL_PAGE_KIB}
        views[node] = NodeView(
            node=node, cores=cores, pool=pool, free_isolated=isolated,
            shared_load=usage.shared_load.get(node, 0.0),
            small_free_kib=usage.small_free_kib(node, reserved_kib), huge_free=huge,
            smt=max((len(c.core.cpus) for c in cores), default=1),
        )
    return views


# ----- guest -> cells ---------------------------------------------------------------------------
def page_options(spec: GuestSpec, topology: HostTopology) -> tuple[int, ...]:
    """Page sizes (KiB) the guest accepts, best first; 4 = small pages."""
    host_sizes = sorted({p.size_kib for n in topology.nodes.values() for p in n.hugepages
                         if p.size_kib > SMALL_PAGE_KIB}, reverse=True)
    if spec.page_size_kib is not None:
        return (spec.page_size_kib,)
    if spec.mem_page_size == "large":
        return tuple(host_sizes)
    if spec.mem_page_size == "any":
        return (*host_sizes, SMALL_PAGE_KIB)
    return (SMALL_PAGE_KIB,)


def node_capacity(spec: GuestSpec, topology: HostTopology, node: int,
                  options: AllocationOptions) -> tuple[int, int]:
    """(vCPUs, memory KiB) an *empty* node could give this guest: sizes guest cells."""
    usable = topology.usable_cpus
    policy = spec.effective_thread_policy
    cpus = 0
    for core in topology.cores_in_node(node):
        online = [c for c in core.cpus if topology.cpus[c].online]
        free = [c for c in online if c in usable]
        if spec.dedicated_vcpu_set and spec.cpu_policy != "mixed":
            if policy == "isolate":
                cpus += 1 if free and len(free) == len(online) else 0
            elif policy == "require":
                cpus += len(free) if len(free) >= 2 and len(free) == len(online) else 0
            else:
                cpus += len(free)
        else:
            cpus += len([c for c in free if c not in topology.isolated or spec.dedicated_vcpu_set])
    info = topology.nodes[node]
    huge = {p.size_kib: p.total * p.size_kib for p in info.hugepages if p.size_kib > SMALL_PAGE_KIB}
    small = info.memory_kib - sum(huge.values()) - options.reserved_memory_mib_per_node * 1024
    memory = max((small if size == SMALL_PAGE_KIB else huge.get(size, 0))
                 for size in page_options(spec, topology) or (SMALL_PAGE_KIB,))
    return cpus, max(0, memory)


def minimum_cells(spec: GuestSpec, topology: HostTopology, options: AllocationOptions) -> int:
    """Fewest cells the guest needs: one when it fits a node's capacity (locality first)."""
    nodes = [n for n in topology.nodes_with_cpus() if n in topology.nodes]
    if not nodes:
        return 1
    caps = [node_capacity(spec, topology, n, options) for n in nodes]
    max_cpus = max(c for c, _ in caps)
    max_mem = max(m for _, m in caps)
    if not max_cpus or not max_mem:
        return 1  # no node could ever hold it: admission of one cell says why
    need_cpu = math.ceil(spec.vcpus / max_cpus)
    if spec.memory_node is not None:
        return max(1, need_cpu)  # its memory goes to the named node whatever the cells
    need_mem = math.ceil(spec.memory_mib * 1024 / max_mem)
    return max(1, need_cpu, need_mem)


def _split(total: int, parts: int) -> list[int]:
    share, rest = divmod(total, parts)
    return [share + (1 if i < rest else 0) for i in range(parts)]


def _memory_split(memory_kib: int, count: int, sizes: tuple[int, ...]) -> list[int]:
    """Split memory over cells in whole pages: equal parts of the largest page that allows it."""
    for size in sorted(set(sizes) | {1024}, reverse=True):
        if memory_kib % (size * count) == 0:
            return [memory_kib // count] * count
    for size in sorted(set(sizes) | {1024}, reverse=True):
        if memory_kib % size == 0 and memory_kib // size >= count:
            return [units * size for units in _split(memory_kib // size, count)]
    return _split(memory_kib, count)


def cell_requests(spec: GuestSpec, count: int, topology: HostTopology) -> tuple[CellRequest, ...]:
    """The guest's cells: the explicit numa_cpus/numa_mem, else vCPUs and memory split evenly."""
    dedicated = spec.dedicated_vcpu_set
    policy = spec.effective_thread_policy
    if spec.numa_cells:
        layout = [(tuple(sorted(c.vcpus)), c.memory_mib * 1024) for c in spec.numa_cells]
    else:
        sizes = _split(spec.vcpus, count)
        memories = _memory_split(spec.memory_mib * 1024, count, page_options(spec, topology))
        start, layout = 0, []
        for size, memory in zip(sizes, memories):
            layout.append((tuple(range(start, start + size)), memory))
            start += size
    cells = []
    for index, (vcpus, memory) in enumerate(layout):
        cells.append(CellRequest(
            id=index, vcpus=vcpus,
            dedicated=tuple(v for v in vcpus if v in dedicated),
            shared=tuple(v for v in vcpus if v not in dedicated),
            memory_kib=memory, thread_policy=policy,
            emulator_extra=1 if index == 0 and spec.emulator_threads == "isolate" else 0,
            memory_node=spec.memory_node_of(index),
        ))
    return tuple(cells)


# ----- admission of one cell on one node --------------------------------------------------------
def admit_cell(view: NodeView, cell: CellRequest, pages: tuple[int, ...],
               options: AllocationOptions) -> tuple[tuple[int, ...], list[NoFitReason]]:
    """(page sizes that fit, reasons it cannot go here). Fits iff no reasons and some page size."""
    where = f"cell {cell.id} on node {view.node}"
    reasons: list[NoFitReason] = []
    if not view.has_cpus:
        reasons.append(NoFitReason("cpus", where, f"{len(cell.vcpus)} vCPUs", "a node without CPUs"))
        return (), reasons
    wanted = len(cell.dedicated)
    taken = 0  # fewest threads the dedicated part removes from the node (lower bound)
    if wanted:
        whole = view.whole_cores
        if cell.thread_policy == "isolate":
            if len(whole) < wanted:
                reasons.append(NoFitReason(
                    "whole-cores", where, f"{wanted} free whole cores (thread_policy isolate)",
                    f"{len(whole)}", "one vCPU per core, sibling threads kept idle"))
            else:
                taken = sum(sorted(len(c.free) for c in whole)[:wanted])
                rest = view.free_threads - taken
                if rest < cell.emulator_extra:
                    reasons.append(NoFitReason("emulator-cpu", where, "1 free pCPU for the isolated emulator thread", f"{rest}"))
                taken += cell.emulator_extra
        elif cell.thread_policy == "require":
            pairs = [c for c in whole if len(c.free) >= 2]
            if view.smt < 2:
                reasons.append(NoFitReason("smt", where, "SMT sibling threads (thread_policy require)", "1 thread per core"))
            else:
                threads, cores = 0, 0
                for core in sorted(pairs, key=lambda c: -len(c.free)):
                    if threads >= wanted:
                        break
                    threads += len(core.free)
                    cores += 1
                if threads < wanted:
                    reasons.append(NoFitReason(
                        "sibling-pairs", where, f"{math.ceil(wanted / view.smt)} free whole SMT cores for {wanted} vCPUs",
                        f"{len(pairs)}"))
                taken = threads
            if not reasons and view.free_threads - taken < cell.emulator_extra:
                reasons.append(NoFitReason("emulator-cpu", where, "1 free pCPU for the isolated emulator thread", f"{view.free_threads - taken}"))
            taken += cell.emulator_extra
        else:
            need = wanted + cell.emulator_extra
            if view.free_threads < need:
                reasons.append(NoFitReason("dedicated-cpus", where, f"{need} free pCPUs", f"{view.free_threads}"))
            taken = need
    load = view.shared_load + len(cell.shared)
    if load > 0:
        shrink = max(0, taken - view.free_isolated)
        pool_after = len(view.pool) - shrink
        capacity = pool_after * options.cpu_allocation_ratio
        if pool_after < 1 or capacity < load:
            reasons.append(NoFitReason(
                "shared-pool", where,
                f"{load:g} floating vCPUs at ratio {options.cpu_allocation_ratio:g} (≥ {math.ceil(load / options.cpu_allocation_ratio)} pCPUs)",
                f"{max(0, pool_after)} shared pCPUs after dedicating {taken}"))
    if cell.memory_node is not None:
        return (pages if not reasons else ()), reasons  # memory: admit_memory_nodes
    fitting, memory_reasons = admit_memory(view, cell, pages)
    if not fitting:
        reasons.extend(memory_reasons)
    return (fitting if not reasons else ()), reasons


def admit_memory(view: NodeView, cell: CellRequest, pages: tuple[int, ...]) -> tuple[tuple[int, ...], list[NoFitReason]]:
    where = f"cell {cell.id} on node {view.node}"
    fitting: list[int] = []
    reasons: list[NoFitReason] = []
    mib = cell.memory_kib / 1024
    if not pages:
        reasons.append(NoFitReason("hugepages", where, "a hugepage pool (mem_page_size large)", "none on this host"))
    for size in pages:
        if size == SMALL_PAGE_KIB:
            if view.small_free_kib >= cell.memory_kib:
                fitting.append(size)
            else:
                reasons.append(NoFitReason("memory", where, f"{mib:g} MiB", f"{view.small_free_kib / 1024:g} MiB free"))
            continue
        if cell.memory_kib % size:
            reasons.append(NoFitReason("page-size", where, f"memory a multiple of {size} KiB pages", f"{cell.memory_kib} KiB"))
            continue
        need = cell.memory_kib // size
        have = view.huge_free.get(size, 0)
        if have >= need:
            fitting.append(size)
        else:
            reasons.append(NoFitReason("hugepages", where, f"{need} free {size} KiB pages", f"{have}"))
    return tuple(fitting), reasons


# ----- memory on named memory-only nodes -------------------------------------------------------
def admit_memory_nodes(topology: HostTopology, views: dict[int, NodeView], cells: tuple[CellRequest, ...],
                       pages: tuple[int, ...]) -> tuple[tuple[int, ...], list[NoFitReason]]:
    """(page sizes every named memory-only node can give, reasons it cannot).

    Cells whose request names a node (`memory_node`) keep their memory there,
    apart from their vCPUs; cells naming the same node share its room. The
    node must exist on this host and have no CPUs: naming a CPU node would
    take memory the engine hands out with that node's vCPUs.
    """
    named: dict[int, list[CellRequest]] = {}
    for cell in cells:
        if cell.memory_node is not None:
            named.setdefault(cell.memory_node, []).append(cell)
    if not named:
        return pages, []
    fitting = set(pages)
    reasons: list[NoFitReason] = []
    memory_only = topology.memory_only_nodes
    for node, group in sorted(named.items()):
        where = f"memory_node {node} ({_cells_text(group)})"
        if node not in topology.nodes:
            reasons.append(NoFitReason("memory-node", where, f"node {node} on the host",
                                       f"nodes {_ids(topology.nodes)} (memory-only: {_ids(memory_only)})"))
            continue
        if node not in memory_only:
            cpus = topology.cpus_in_node(node)
            reasons.append(NoFitReason(
                "memory-node", where, "a memory-only (CPU-less) node",
                f"node {node} with CPUs {_ids(cpus)} (memory-only here: {_ids(memory_only)})",
                "memory on a CPU node comes with that node's vCPUs; leave memory_node out for that"))
            continue
        node_pages, node_reasons = _admit_on_memory_node(views[node], group, pages, where)
        fitting &= set(node_pages)
        reasons.extend(node_reasons)
    result = tuple(p for p in pages if p in fitting)
    if not result and not reasons:
        reasons.append(NoFitReason("memory-node", "host", "one page size every named memory node can give",
                                   "none in common"))
    return (result if not reasons else ()), reasons


def _admit_on_memory_node(view: NodeView, group: list[CellRequest], pages: tuple[int, ...],
                          where: str) -> tuple[tuple[int, ...], list[NoFitReason]]:
    total = sum(c.memory_kib for c in group)
    fitting: list[int] = []
    reasons: list[NoFitReason] = []
    for size in pages:
        if size == SMALL_PAGE_KIB:
            if view.small_free_kib >= total:
                fitting.append(size)
            else:
                reasons.append(NoFitReason("memory", where, f"{total / 1024:g} MiB",
                                           f"{view.small_free_kib / 1024:g} MiB free"))
            continue
        if any(c.memory_kib % size for c in group):
            reasons.append(NoFitReason("page-size", where, f"memory a multiple of {size} KiB pages",
                                       ", ".join(f"cell {c.id}: {c.memory_kib} KiB" for c in group)))
            continue
        need, have = total // size, view.huge_free.get(size, 0)
        if have >= need:
            fitting.append(size)
        else:
            reasons.append(NoFitReason("hugepages", where, f"{need} free {size} KiB pages", f"{have}"))
    return tuple(fitting), ([] if fitting else reasons)


def _cells_text(cells: list[CellRequest]) -> str:
    ids = [c.id for c in cells]
    return f"cell {ids[0]}" if len(ids) == 1 else "cells " + ", ".join(str(i) for i in ids)


def _ids(values: Iterable[int]) -> str:
    return format_cpuset(values) or "none"
