"""Candidate migrations: a guest to another host, pinned there greedily or by the placement
engine (guests vmplacer placed), paid for by its cost (core/rebalance/migration_cost.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vmplacer.core.placement.allocate import allocate
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.placement.nofit import NoFit
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.layout import HostLayout
from vmplacer.core.rebalance.local_moves import place_on
from vmplacer.core.rebalance.migration_cost import migration_cost
from vmplacer.core.rebalance.state import FLOATING, GuestState
from vmplacer.core.rebalance.whatif import (
    CandidateMove,
    GuestChange,
    current_placement,
    destination_memory_nodes,
    floors_hold,
    floors_ok,
    host_objective,
    linear_objective,
    objective_of,
)


def best_migration(draft: Draft, inputs: PlanInputs) -> CandidateMove | None:
    settings = inputs.settings
    if not settings.allow_migration or len(draft.hosts) < 2:
        return None
    perf = draft.perf_now  # every guest's, kept up to date by each move taken (search.take_move)
    candidates = sorted(
        (g for g in draft.guests.values()
         if g.movable and g.migratable and g.name not in draft.migrated and g.name in perf),
        key=lambda g: (-g.weight * (1.0 - perf[g.name]), g.name),
    )[: settings.migration_candidates]
    best: CandidateMove | None = None
    spare = {name: _spare(h) for name, h in draft.hosts.items()}
    for guest in candidates:
        if guest.weight * (1.0 - perf[guest.name]) <= settings.min_migration_gain / 2:
            continue
        source = draft.hosts[draft.host_of[guest.name]]
        destinations = sorted(
            (h for h in draft.hosts.values() if h is not source and h.state.accepts_migrations),
            key=lambda h: (-spare[h.name], h.name),
        )[: settings.destination_candidates]
        for destination in destinations:
            move = migration_move(draft, inputs, guest, source, destination)
            if move and (best is None or move.gain > best.gain):
                best = move
    return best


def _visit(draft: Draft, inputs: PlanInputs, destination: HostLayout, visitor: GuestState,
           pins: Mapping[int, frozenset[int]]) -> tuple[float, float] | None:
    """The destination's objective and linear objective with `visitor` pinned there as `pins`,
    or None when a guest's floor would break; the destination is left as it was."""
    destination.add(visitor, pins)
    try:
        pieces = destination.pieces()
        perf = destination.perf(pieces, pieces.cpu)[0]
        if not floors_ok(draft, inputs, pieces, perf)[0]:
            return None
        return float(objective_of(inputs, pieces, perf)[0]), linear_objective(inputs, destination)
    finally:
        destination.remove(visitor.name)


def migration_move(draft: Draft, inputs: PlanInputs, guest: GuestState, source: HostLayout, destination: HostLayout) -> CandidateMove | None:
    name = guest.name
    src_before = host_objective(inputs, source)
    src_lin_before = linear_objective(inputs, source)
    dst_before = host_objective(inputs, destination)
    dst_lin_before = linear_objective(inputs, destination)
    pins_here = source.pins[name]
    source.remove(name)
    try:
        src_after = host_objective(inputs, source)
        src_lin_after = linear_objective(inputs, source)
        src_ok = floors_hold(draft, inputs, source)
    finally:
        source.add(guest, pins_here)
    if not src_ok:
        return None
    visitor = replace(guest, host=destination.name, placement=replace(guest.placement, host=destination.name))
    placement = None
    if guest.spec is not None:
        placement = _engine_placement(draft, destination, visitor)
        if placement is None:
            return None
        pins = dict(placement.vcpupin)
        scored = _visit(draft, inputs, destination, visitor, pins)
        if scored is None:
            return None
        dst_after, dst_lin_after = scored
    elif guest.mode == FLOATING:
        pool = frozenset(destination.usable - destination.owned_by_others(None))
        if not pool:
            return None
        pins = {v: pool for v in guest.placement.vcpupin}
        if not _anti_affinity_ok(inputs, destination, guest, frozenset(destination.node_of[c] for c in pool)):
            return None
        scored = _visit(draft, inputs, destination, visitor, pins)
        if scored is None:
            return None
        dst_after, dst_lin_after = scored
    else:
        move = place_on(draft, inputs, destination, name, node=None, base_obj=dst_before, base_lin=dst_lin_before,
                              guest=visitor)
        if move is None:
            return None
        pins = move.changes[0].pins
        dst_after = dst_before + move.gain
        dst_lin_after = dst_lin_before + move.linear_gain
    memory_nodes = destination_memory_nodes(draft, destination, guest, pins, placement)
    if memory_nodes is None:
        return None
    # Anti-affinity is per NUMA node: the engine and `allowed` kept the vCPUs off the
    # peers' nodes; the memory must stay off them too.
    used_nodes = frozenset(destination.node_of[c] for cpus in pins.values() for c in cpus)
    if not _anti_affinity_ok(inputs, destination, guest, used_nodes | memory_nodes):
        return None
    settings = inputs.settings
    cost = migration_cost(
        guest.placement.memory_kib / 1024.0,
        guest.dirty_mib_s if guest.dirty_mib_s is not None else settings.default_dirty_mib_s,
        settings.migration_bandwidth_mib_s,
        max_downtime_s=settings.max_downtime_s,
        copy_slowdown=settings.copy_slowdown,
    )
    if not cost.converges:
        draft.rejected.append(f"migrate {name} to {destination.name}: {cost.reason}")
        return None
    raw = (src_after - src_before) + (dst_after - dst_before)
    lin = (src_lin_after - src_lin_before) + (dst_lin_after - dst_lin_before)
    paid = guest.weight * cost.lost_perf_s / settings.horizon_s
    change = GuestChange(name, destination.name, pins, memory_nodes=memory_nodes, placement=placement)
    return CandidateMove("migrate", [change], raw - paid, lin - paid, cost={**cost.to_dict(), "paid": paid},
                 reason=f"{name}: {source.name} → {destination.name}, predicted +{raw:.3f} "
                        f"(cost {paid:.4f} over {settings.horizon_s:g} s)")


def _engine_placement(draft: Draft, destination: HostLayout, guest: GuestState) -> Placement | None:
    """Where the placement engine would put a guest vmplacer placed (all its rules apply)."""
    assert guest.spec is not None
    others = [current_placement(draft, n) for n in destination.guests]
    anti = {n: draft.guests[n].anti_affinity for n in destination.guests if draft.guests[n].anti_affinity}
    try:
        return allocate(destination.topology, guest.spec, others, options=destination.state.options,
                        anti_affinity_of_others=anti)
    except NoFit:
        return None


def _anti_affinity_ok(inputs: PlanInputs, host: HostLayout, guest: GuestState, nodes: frozenset[int] | None) -> bool:
    peers = set(guest.anti_affinity) | inputs.refused_by.get(guest.name, set())
    present = peers & set(host.guests)
    if not present:
        return True
    if nodes is None:
        return False  # nodes not known: refuse
    for peer in present:
        peer_nodes = {host.node_of[c] for cpus in host.pins[peer].values() for c in cpus}
        if peer_nodes & nodes:
            return False
    return True


def _spare(host: HostLayout) -> float:
    demand = sum(g.load * len(host.pins[n]) for n, g in host.guests.items())
    return len(host.usable) - demand
