"""Exact layouts of small hosts: the search's what-if state as a LayoutProblem, and back.

The local search climbs one move or swap at a time and stops at the first
layout no single step improves; on a full host, where pairing guests on SMT
siblings decides, that is often not the best one. For hosts with few pCPUs
(`exact_max_cpus`), the same objective is handed to an exact solver (behind
`LayoutSolver`), warm-started from the layout the local search reached; when it
finds a better layout, that layout becomes one move ("relayout"), judged like
any other move. Several small hosts are solved together (migrations included)
when all their pCPUs together stay within the limit.

The problem is exact for layouts where no pCPU is asked for more than its
time, and for up to `SHARE_GROUP` equally loaded vCPUs time-sharing one pCPU
no guest outside the problem is pinned to (each gets its share of it, as the
what-if has it): the solver's space, with at most one such pCPU, and only
where there are more vCPUs than cores (else a core of its own beats a share of
a pCPU). On a full host with large sibling losses, heavy guests on one pCPU
with its sibling idle can beat any one-per-pCPU layout. Guests that stay where
they are (floating, fixed, out of scope) count as load and as neighbours;
whether their floating time shares change is left to the final evaluation,
which always uses the search's own arithmetic.

In the model's multiplicative form (`ModelConfig.form`) a guest keeps exp(−Σ β·g) of its
speed, which no sum of pair terms is; the problem is then its first-order expansion around the
layout the hosts have (each item guest's pair terms weighted by the speed it keeps there, its
own time by what that speed is worth), solved, expanded again around the solver's layout and
solved again (`RELINEARIZE` times at most, one host at a time). The tangent lies below the
convex exp, so it undervalues layouts far from where it touches: a second chain starts from the
tangent at full speed (the additive terms as they are) and re-expands the same way. The layout
the search's own arithmetic rates best of both chains is the answer. Exact for the additive
form; for the multiplicative one a close guess the climb polishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
import numpy as np

from vmplacer.core.model.interference import MULTIPLICATIVE
from vmplacer.core.rebalance.layout_problem import LayoutProblem, LayoutSolution, LayoutSolver
from vmplacer.core.rebalance.migration_cost import migration_cost
from vmplacer.core.rebalance.layout import HostLayout, locality_nodes
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.search import actions_if, climb, decline, held_back, take_move, threshold_of
from vmplacer.core.rebalance.state import EXCLUSIVE, PINNED, GuestState
from vmplacer.core.rebalance.whatif import (
    EPS,
    CandidateMove,
    GuestChange,
    destination_memory_nodes,
    floors_hold,
    host_objective,
    judge,
    linear_objective,
    may_pin,
    new_move,
    try_move,
    violations,
)
from vmplacer.core.text import plural

RELINEARIZE = 3  # multiplicative form: re-expansions around the solver's own layout, one host at a time
_RANKS = 6  # same-cpu … remote-node (DistanceClass.rank); rank 5 holds every pCPU pair of one host
SHARE_GROUP = 4  # at most this many vCPUs on the one time-shared pCPU an exact layout may have


class NotExact(Exception):
    """The hosts cannot be put as a LayoutProblem (the reason says why)."""


def solver_items(draft: Draft, inputs: PlanInputs, host: HostLayout) -> list[str]:
    """Guests whose every vCPU the solver may place: movable and pinned 1:1, or floating where
    the search may pin them again (`may_pin`: the solver's layout pins them 1:1)."""
    result = []
    for name, guest in host.guests.items():
        if may_pin(draft, inputs, name):
            result.append(name)
        elif (guest.mode in (PINNED, EXCLUSIVE) and draft.guests[name].movable
              and all(len(p) == 1 for p in host.pins[name].values())):
            result.append(name)
    return result


def _may_migrate(draft: Draft, inputs: PlanInputs, guest: GuestState) -> bool:
    return (inputs.settings.allow_migration and guest.migratable and guest.spec is None and guest.mode == PINNED
            and not guest.placement.memory_nodes and not guest.placement.cells and guest.name not in draft.migrated)


def _partition(dist: np.ndarray, rank: int) -> np.ndarray | None:
    """Group ids of "distance ≤ rank", or None when that is not an equivalence (a non-nested topology)."""
    n = len(dist)
    group = np.full(n, -1, dtype=np.int64)
    close = dist <= rank
    for s in range(n):
        if group[s] >= 0:
            continue
        members = np.flatnonzero(close[s])
        if not np.all(close[np.ix_(members, members)]) or np.any(group[members] >= 0):
            return None
        group[members] = s
    return group


def build_problem(draft: Draft, inputs: PlanInputs, host_names: Sequence[str],
                  kept: dict[str, float] | None = None) -> LayoutProblem:
    """The what-if layout of `host_names` as a LayoutProblem (raises NotExact); in the
    multiplicative form expanded around the speed each guest keeps (`kept`: guest → exp(−Σ β·g),
    default as the hosts are)."""
    hosts = [draft.hosts[n] for n in host_names]
    host_index = {h.name: k for k, h in enumerate(hosts)}
    betas = inputs.betas
    settings = inputs.settings

    # ----- slots and levels
    slots: list[tuple[str, int]] = []
    slot_local: list[int] = []
    slot_host: list[int] = []
    level_ids = [[] for _ in range(_RANKS)]
    offset = 0
    for k, host in enumerate(hosts):
        usable = [c for c in host.cpus if c in host.usable]
        local = np.array([host.index[c] for c in usable], dtype=np.int64)
        dist = host.dist[np.ix_(local, local)]
        for rank in range(_RANKS):
            groups = _partition(dist, rank)
            if groups is None:
                raise NotExact(f"host {host.name}: its cache and core groups do not nest")
            level_ids[rank].extend((groups + offset).tolist())
        offset += len(usable)
        slots.extend((host.name, c) for c in usable)
        slot_local.extend(local.tolist())
        slot_host.extend([k] * len(usable))
    n_slots = len(slots)
    if n_slots == 0:
        raise NotExact("no usable pCPU")
    slot_host_a = np.array(slot_host, dtype=np.int64)
    levels_all = np.array(level_ids, dtype=np.int64)  # [6, S]

    # ----- guests: items (placed by the solver) and the rest (fixed load)
    item_guests: list[str] = []
    fixed_guests: list[str] = []
    for host in hosts:
        items = solver_items(draft, inputs, host)
        item_guests.extend(items)
        fixed_guests.extend(n for n in host.guests if n not in items)
    if not item_guests:
        raise NotExact("no guest the solver may place")
    guests = item_guests + fixed_guests
    g_index = {n: i for i, n in enumerate(guests)}
    guest_state = {n: draft.guests[n] for n in guests}
    identities = {}
    for n in guests:
        identities.setdefault(betas.identity(guest_state[n]), len(identities))
    table = betas.tensor(list(identities))  # [rank, background, foreground] or None
    ident = {n: identities[betas.identity(guest_state[n])] for n in guests}

    def beta(rank: np.ndarray | int, background: int, foreground: int) -> np.ndarray:
        if table is None:
            return np.zeros_like(np.asarray(rank, dtype=float))
        return table[rank, background, foreground]

    items: list[tuple[str, int]] = []
    item_guest: list[int] = []
    item_load: list[float] = []
    origin: dict[str, int] = {}
    for host in hosts:
        for name in item_guests:
            if name in host.guests:
                origin[name] = host_index[host.name]
                for vcpu in sorted(host.pins[name]):
                    items.append((name, vcpu))
                    item_guest.append(g_index[name])
                    item_load.append(guest_state[name].load)
    n_items, n_guests = len(items), len(guests)
    item_guest_a = np.array(item_guest, dtype=np.int64)
    load = np.array(item_load, dtype=float)
    ideal = np.array([guest_state[n].ideal for n in guests], dtype=float)

    # ----- fixed pieces per host: where they are, what they get, whose they are
    fixed_pieces = {}
    base = np.zeros(n_guests)
    capacity = np.ones(n_slots)
    approximate = False
    for k, host in enumerate(hosts):
        names = [n for n in fixed_guests if n in host.guests]
        if not names:
            fixed_pieces[k] = None
            continue
        layout = {n: host.pins[n] for n in names}
        pieces = host.pieces(layout)
        perf = host.perf(pieces, pieces.cpu)[0][0]
        for i, n in enumerate(pieces.guests):
            base[g_index[n]] = perf[i]
        n_local = len(host.cpus)
        asked = np.bincount(pieces.cpu, weights=pieces.demand, minlength=n_local)
        granted = pieces.demand * np.minimum(1.0, 1.0 / np.maximum(asked[pieces.cpu], 1e-12))
        pinned = np.bincount(pieces.cpu[pieces.single], weights=pieces.demand[pieces.single], minlength=n_local)
        if np.any(~pieces.single):
            approximate = True
        fixed_pieces[k] = (pieces.cpu, granted, np.array([g_index[pieces.guests[v]] for v in pieces.vm]),
                           np.array([ident[pieces.guests[v]] for v in pieces.vm]), pieces.single)
        for s in np.flatnonzero(slot_host_a == k):
            capacity[s] = max(0.0, 1.0 - pinned[slot_local[s]])
    for name in item_guests:
        base[g_index[name]] = 1.0

    # ----- where each item may go
    allowed = np.zeros((n_items, n_slots), dtype=bool)
    move_cost = np.zeros(n_guests)
    refused = {n: set(guest_state[n].anti_affinity) | inputs.refused_by.get(n, set()) for n in guests}
    for i, (name, vcpu) in enumerate(items):
        guest = guest_state[name]
        home = origin[name]
        migrate = _may_migrate(draft, inputs, guest) and len(hosts) > 1
        if migrate:
            cost = migration_cost(guest.placement.memory_kib / 1024.0,
                                  guest.dirty_mib_s if guest.dirty_mib_s is not None else settings.default_dirty_mib_s,
                                  settings.migration_bandwidth_mib_s, max_downtime_s=settings.max_downtime_s,
                                  copy_slowdown=settings.copy_slowdown)
            migrate = cost.converges
            move_cost[g_index[name]] = guest.weight * cost.lost_perf_s / settings.horizon_s if migrate else 0.0
        for k, host in enumerate(hosts):
            if k != home and not (migrate and host.state.accepts_migrations):
                continue
            cpus = set(host.usable)
            if k == home:
                nodes = locality_nodes(host, guest, host.pins[name])
                if nodes:
                    cpus &= set().union(*(host.node_cpus[n] for n in nodes))
            fixed_here = [n for n in fixed_guests if n in host.guests]
            for other in fixed_here:
                other_state = host.guests[other]
                if other_state.mode == EXCLUSIVE or other_state.placement.exclusive_cpus:
                    owned = set(other_state.placement.exclusive_cpus)
                    for pins in host.pins[other].values():
                        for c in pins:
                            owned |= host.siblings[c] if other_state.thread_policy == "isolate" else {c}
                    cpus -= owned
                if other in refused[name]:
                    for pins in host.pins[other].values():
                        for c in pins:
                            cpus -= host.node_cpus[host.node_of[c]]
            if guest.mode == EXCLUSIVE:
                busy = {c for n in fixed_here for pins in host.pins[n].values() if len(pins) == 1 for c in pins}
                cpus -= busy
                if guest.thread_policy == "isolate":
                    cpus = {c for c in cpus if not (host.siblings[c] - {c}) & busy}
            for s in np.flatnonzero(slot_host_a == k):
                if slots[s][1] in cpus and capacity[s] + 1e-9 >= load[i]:
                    allowed[i, s] = True
        if not allowed[i].any():
            raise NotExact(f"{name} vCPU {vcpu}: no pCPU it may take")

    shareable = capacity >= 1.0 - 1e-9  # no pinned guest outside the problem: time sharing is exact there
    room = capacity.sum() + (SHARE_GROUP - 1.0 if shareable.any() else 0.0)  # one time-shared pCPU
    if load.sum() > room + 1e-9:
        raise NotExact(f"the guests ask for {load.sum():.1f} pCPUs of the {capacity.sum():.1f} free: "
                       "no layout with at most one time-shared pCPU")

    # ----- item ↔ fixed interference: the unary terms
    unary = np.zeros((n_items, n_slots, n_guests))
    for k, host in enumerate(hosts):
        if fixed_pieces[k] is None:
            continue
        f_cpu, f_granted, f_guest, f_ident, _ = fixed_pieces[k]
        cols = np.flatnonzero(slot_host_a == k)
        local = np.array([slot_local[s] for s in cols], dtype=np.int64)
        dist = host.dist[np.ix_(local, f_cpu)]  # [slots, fixed pieces]
        neighbour = dist != 0
        for i in range(n_items):
            g = item_guest[i]
            mine = ident[guests[g]]
            suffered = np.where(neighbour, beta(dist, f_ident[None, :], mine), 0.0) * f_granted[None, :]
            unary[i, cols, g] -= load[i] * suffered.sum(axis=1) / ideal[g]
            caused = np.where(neighbour, beta(dist, mine, f_ident[None, :]), 0.0) * f_granted[None, :] * load[i]
            for f in range(len(f_cpu)):
                unary[i, cols, f_guest[f]] -= caused[:, f] / ideal[f_guest[f]]

    # ----- item ↔ item interference: per-level increments
    pairs, effects = [], []
    for a in range(n_items):
        for b in range(a + 1, n_items):
            ga, gb = item_guest[a], item_guest[b]
            if ga == gb:
                continue
            ia, ib = ident[guests[ga]], ident[guests[gb]]
            ranks = np.arange(_RANKS)
            on_a = -load[a] * load[b] * beta(ranks, ib, ia) / ideal[ga]
            on_b = -load[a] * load[b] * beta(ranks, ia, ib) / ideal[gb]
            on_a[0] = on_b[0] = 0.0  # one pCPU: time shared, never at the same instant
            inc = np.stack([on_a - np.append(on_a[1:], 0.0), on_b - np.append(on_b[1:], 0.0)], axis=1)  # [6, 2]
            pairs.append((a, b))
            effects.append(inc)
    pair_a = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    effect_a = np.array(effects, dtype=float).reshape(-1, _RANKS, 2)

    # ----- drop levels that repeat the finer one (their increments fold into it)
    keep: list[int] = []
    for rank in range(_RANKS):
        if keep and np.array_equal(levels_all[rank], levels_all[keep[-1]]):
            effect_a[:, keep[-1]] += effect_a[:, rank]
            continue
        keep.append(rank)
    levels = levels_all[keep]
    effect_a = effect_a[:, keep] if len(pairs) else np.zeros((0, len(keep), 2))

    item_time = np.array([load[i] / ideal[item_guest[i]] for i in range(n_items)], dtype=float)
    if betas.form == MULTIPLICATIVE and table is not None:
        kept = kept if kept is not None else kept_speed(draft, inputs, host_names)
        _expand(kept, [g_index[n] for n in item_guests], guests, base, unary, pair_a, item_guest_a, effect_a, item_time)

    weight = np.array([guest_state[n].weight for n in guests], dtype=float)
    floor = np.full(n_guests, -np.inf)
    for n, value in inputs.floors.items():
        if n in g_index:
            floor[g_index[n]] = min(value, inputs.start_perf.get(n, value)) - 1e-6
    exclusive = np.array([guest_state[n].mode == EXCLUSIVE for n, _ in items], dtype=bool)
    isolate = np.array([guest_state[n].mode == EXCLUSIVE and guest_state[n].thread_policy == "isolate"
                        for n, _ in items], dtype=bool)
    cores: dict[tuple[str, int], int] = {}
    core_group = np.array([cores.setdefault((h, draft.hosts[h].topology.cpus[c].core), len(cores))
                           for h, c in slots], dtype=np.int64)
    node_group = np.array([k * 100_000 + hosts[k].node_of[slots[s][1]] for s, k in enumerate(slot_host)],
                          dtype=np.int64)
    apart = tuple(sorted({tuple(sorted((g_index[a], g_index[b]))) for a in item_guests for b in refused[a]
                          if b in g_index and b in item_guests and b != a}))
    # time sharing can only pay when some guests must share a core anyway (more vCPUs than cores)
    max_shared = int(n_items > len(set(core_group[shareable].tolist())) and shareable.any())
    origin_host = np.full(n_guests, -1, dtype=np.int64)
    for name, k in origin.items():
        origin_host[g_index[name]] = k
    slot_of = {slot: s for s, slot in enumerate(slots)}
    hint = []
    for name, vcpu in items:
        cpus = draft.hosts[host_names[origin[name]]].pins[name][vcpu]
        hint.append(slot_of.get((host_names[origin[name]], next(iter(cpus))), -1) if len(cpus) == 1 else -1)
    return LayoutProblem(
        guests=tuple(guests), items=tuple(items), slots=tuple(slots), item_guest=item_guest_a, allowed=allowed,
        item_load=load, capacity=capacity, base=base, unary=unary, levels=levels, pairs=pair_a,
        pair_effect=effect_a, weight=weight, floor=floor, fairness=settings.fairness, exclusive=exclusive,
        isolate=isolate, core_group=core_group, node_group=node_group, apart=apart, slot_host=slot_host_a,
        origin_host=origin_host, move_cost=move_cost,
        hint=np.array(hint, dtype=np.int64) if min(hint, default=0) >= 0 else None,
        approximate=approximate, shareable=shareable, max_shared=max_shared, share_group=SHARE_GROUP,
        item_time=item_time,
    )


def _expand(kept: dict[str, float], item_guests: list[int], guests: list[str], base: np.ndarray,
            unary: np.ndarray, pairs: np.ndarray, item_guest: np.ndarray, effect: np.ndarray,
            item_time: np.ndarray) -> None:
    """Turn the additive terms into the first-order expansion of s·exp(−L) around L⁰ (in place):
    s·exp(−L) ≈ m·(1 + L⁰)·s − m·s·L with m = exp(−L⁰), exact at L = L⁰. Guests outside the
    problem keep their additive terms (small: they are what the items do to them)."""
    m = np.ones(len(guests))
    c = np.ones(len(guests))
    for g in item_guests:
        k = min(max(float(kept.get(guests[g], 1.0)), 1e-6), 1.0)
        m[g], c[g] = k, k * (1.0 - np.log(k))
    items_of = np.zeros(len(guests), dtype=bool)
    items_of[item_guests] = True
    base[items_of] *= c[items_of]
    item_time *= c[item_guest]
    unary[:, :, items_of] *= m[items_of][None, None, :]
    if len(pairs):
        effect[:, :, 0] *= m[item_guest[pairs[:, 0]]][:, None]
        effect[:, :, 1] *= m[item_guest[pairs[:, 1]]][:, None]


def kept_speed(draft: Draft, inputs: PlanInputs, host_names: Sequence[str]) -> dict[str, float]:
    """Per guest on the hosts: the fraction of its time-shared speed its neighbours leave it."""
    result = {}
    for name in host_names:
        host = draft.hosts[name]
        if not host.guests:
            continue
        pieces = host.pieces()
        perf, linear = host.perf(pieces, pieces.cpu)
        for i, guest in enumerate(pieces.guests):
            result[guest] = float(perf[0][i] / linear[0][i]) if linear[0][i] > 1e-12 else 1.0
    return result


def layout_changes(draft: Draft, inputs: PlanInputs, problem: LayoutProblem,
                   solution: LayoutSolution) -> dict[str, tuple[str, dict]]:
    """guest -> (host, pins) for every guest the solution puts somewhere else."""
    wanted: dict[str, tuple[str, dict[int, frozenset[int]]]] = {}
    for (name, vcpu), slot in zip(problem.items, solution.assignment):
        host, cpu = problem.slots[slot]
        _, pins = wanted.setdefault(name, (host, {}))
        pins[vcpu] = frozenset({cpu})
    result = {}
    for name, (host, pins) in wanted.items():
        if host != draft.host_of[name] or pins != draft.hosts[draft.host_of[name]].pins[name]:
            result[name] = (host, pins)
    return result


def solve_hosts(draft: Draft, inputs: PlanInputs, solver: LayoutSolver, host_names: Sequence[str],
                time_limit_s: float) -> tuple[LayoutProblem, LayoutSolution | None]:
    problem = build_problem(draft, inputs, host_names)
    if problem.hint is not None and problem.violations(problem.hint):
        problem = replace(problem, hint=None)
    solution = solver.solve(problem, time_limit_s=time_limit_s)
    if inputs.betas.form != MULTIPLICATIVE or solution is None or len(host_names) != 1 or problem.approximate:
        return problem, solution
    start_hint = problem.hint  # the hosts' layout: what the plan reports "before" by
    spent = solution.spent
    value, kept = _rated(draft, inputs, host_names, problem, solution)
    best = (value, problem, solution)
    chains = [(problem, solution, kept)]
    # A second chain from the tangent at full speed (every guest keeping all of it): the tangent
    # around the hosts' layout undervalues layouts far from it (exp is convex), this one others.
    full = {name: 1.0 for name in kept}
    first = replace(build_problem(draft, inputs, host_names, full), hint=problem.hint)
    if first.items == problem.items and first.slots == problem.slots and not (
            first.hint is not None and first.violations(first.hint)):
        other = solver.solve(first, time_limit_s=time_limit_s)
        if other is not None:
            spent += other.spent
            value, other_kept = _rated(draft, inputs, host_names, first, other)
            if value > best[0] + 1e-12:
                best = (value, first, other)
            chains.append((first, other, other_kept))
    for problem, solution, kept in chains:
        for _ in range(RELINEARIZE):
            again = replace(build_problem(draft, inputs, host_names, kept),
                            hint=np.asarray(solution.assignment, dtype=np.int64))
            if again.items != problem.items or again.slots != problem.slots or again.violations(again.hint):
                break
            following = solver.solve(again, time_limit_s=time_limit_s)
            if following is None:
                break
            spent += following.spent
            if tuple(following.assignment) == tuple(solution.assignment):
                break
            problem, solution = again, following
            value, kept = _rated(draft, inputs, host_names, problem, solution)
            if value > best[0] + 1e-12:
                best = (value, problem, solution)
    _, chosen, solution = best
    spent_as = {"seconds": spent} if solution.work is None else {"work": spent}
    return replace(chosen, hint=start_hint), replace(solution, **spent_as)


def _rated(draft: Draft, inputs: PlanInputs, host_names: Sequence[str], problem: LayoutProblem,
           solution: LayoutSolution) -> tuple[float, dict[str, float]]:
    """The solution's layout by the search's own arithmetic: the hosts' objective, and the speed
    each guest keeps there (for the next expansion)."""
    wanted = layout_changes(draft, inputs, problem, solution)
    undo = try_move(draft, new_move("relayout", [(g, h, pins) for g, (h, pins) in wanted.items()]))
    try:
        return (sum(host_objective(inputs, draft.hosts[h]) for h in host_names), kept_speed(draft, inputs, host_names))
    finally:
        undo()


def solved_layout(problem: LayoutProblem, solution: LayoutSolution) -> dict[str, dict[int, frozenset[int]]]:
    """guest -> vCPU -> {pCPU}: where the solver put every guest it placed."""
    layout: dict[str, dict[int, frozenset[int]]] = {}
    for (name, vcpu), slot in zip(problem.items, solution.assignment):
        layout.setdefault(name, {})[vcpu] = frozenset({problem.slots[slot][1]})
    return layout


def exact_layout_of(draft: Draft, inputs: PlanInputs, solver: LayoutSolver, name: str, time_s: float
                    ) -> dict[str, dict[int, frozenset[int]]] | None:
    """Host `name`'s exact layout by the coefficients of `search` (a what-if search: optimistic,
    or the model's other form); None when the host is not solved exactly or the solver found no
    layout in `time_s`."""
    try:
        problem, solution = solve_hosts(draft, inputs, solver, [name], time_s)
    except NotExact:
        return None
    return None if solution is None else solved_layout(problem, solution)


def polish(draft: Draft, inputs: PlanInputs) -> None:
    """Stage: where hosts are small, an exact solver's layout from where the climb stopped
    (no solver: nothing)."""
    if inputs.solver is not None:
        polish_hosts(draft, inputs)


def climb_after_polish(draft: Draft, inputs: PlanInputs) -> None:
    """Stage: climb again from the solver's layouts, when the solver moved anything."""
    if any(report.get("taken") for report in draft.exact):
        climb(draft, inputs)


def exact_groups(draft: Draft, inputs: PlanInputs) -> list[list[str]]:
    """Hosts the solver takes: every small host alone, or all small hosts together (with
    migrations) when their pCPUs together stay within `exact_max_cpus`."""
    limit = inputs.settings.exact_max_cpus
    small = [n for n in sorted(draft.hosts) if 0 < len(draft.hosts[n].usable) <= limit]
    busy = [n for n in small if any(draft.guests[g].movable for g in draft.hosts[n].guests)]
    if not busy:
        return []
    joint = [n for n in small if draft.hosts[n].state.accepts_migrations or n in busy]
    if (inputs.settings.allow_migration and len(joint) > 1
            and sum(len(draft.hosts[n].usable) for n in joint) <= limit):
        return [joint]
    return [[n] for n in busy]


def polish_hosts(draft: Draft, inputs: PlanInputs) -> bool:
    settings = inputs.settings
    budget = settings.exact_budget_s
    changed = False
    for group in exact_groups(draft, inputs):
        report: dict = {"hosts": group}
        draft.exact.append(report)
        if budget <= 0:
            report.update(status="skipped", why=f"solver budget of {settings.exact_budget_s:g} deterministic s spent")
            continue
        try:
            problem, solution = solve_hosts(draft, inputs, inputs.solver, group, min(settings.exact_time_s, budget))
        except NotExact as exc:
            report.update(status="not solved", why=str(exc))
            continue
        report.update(items=problem.n_items, slots=problem.n_slots, approximate=problem.approximate)
        if solution is None:
            report.update(status="no solution", why="no layout (at most one time-shared pCPU) keeps every rule")
            continue
        budget -= solution.spent
        report.update(solution.to_dict())
        if problem.hint is not None:
            report["before"] = round(problem.objective(problem.hint), 6)
        if len(group) == 1:
            draft.exact_layouts[group[0]] = solved_layout(problem, solution)
        move = relayout_move(draft, inputs, problem, solution, group, report)
        if move is None:
            continue
        threshold = threshold_of(draft, inputs, move)
        if judge(draft, inputs, move) < threshold or held_back(draft, inputs, move):
            decline(draft, inputs, move, threshold)
            report["taken"] = False
            if move.gain >= threshold and len(group) == 1 and not move.cost:
                # worth it by the model, not sure enough by its data: worth measuring (a trial)
                draft.declined_layouts[group[0]] = solved_layout(problem, solution)
            continue
        if actions_if(draft, move) > settings.max_actions:
            decline(draft, inputs, move, threshold, "max_actions")
            report["taken"] = False
            continue
        take_move(draft, inputs, move)
        report["taken"] = True
        changed = True
    return changed


def relayout_move(draft: Draft, inputs: PlanInputs, problem: LayoutProblem, solution: LayoutSolution, group: list[str],
                  report: dict) -> CandidateMove | None:
    """The solver's layout as one move, judged by the search's own arithmetic."""
    wanted = layout_changes(draft, inputs, problem, solution)
    if not wanted:
        return None
    changes, paid, lost = [], 0.0, 0.0
    for name, (host, pins) in sorted(wanted.items()):
        memory_nodes = None
        if host != draft.host_of[name]:
            memory_nodes = destination_memory_nodes(draft, draft.hosts[host], draft.guests[name], pins, None)
            if memory_nodes is None:
                report["why"] = f"{name}: its memory does not fit on {host}"
                return None
            g = problem.guests.index(name)
            own = float(problem.move_cost[g]) if problem.move_cost is not None else 0.0
            paid += own
            lost += own * inputs.settings.horizon_s / max(draft.guests[name].weight, 1e-9)
        changes.append(GuestChange(name, host, pins, memory_nodes=memory_nodes))
    move = CandidateMove("relayout", changes, 0.0, 0.0)
    before = sum(host_objective(inputs, draft.hosts[h]) for h in group)
    before_lin = sum(linear_objective(inputs, draft.hosts[h]) for h in group)
    undo = try_move(draft, move)
    try:
        after = sum(host_objective(inputs, draft.hosts[h]) for h in group)
        after_lin = sum(linear_objective(inputs, draft.hosts[h]) for h in group)
        broken = [p for h in group for p in violations(draft, draft.hosts[h], [n for n in wanted if n in draft.hosts[h].guests])]
        floors = all(floors_hold(draft, inputs, draft.hosts[h]) for h in group)
    finally:
        undo()
    if broken or not floors:
        report["why"] = broken[0] if broken else "a protected guest would fall below its floor"
        return None
    move.gain = after - before - paid
    move.linear_gain = after_lin - before_lin - paid
    if paid:
        move.cost = {"lost_perf_s": lost, "paid": paid}
    report["gain"] = round(move.gain, 6)
    if move.gain <= EPS:
        return None
    move.reason = (f"exact layout of {', '.join(group)} ({solution.status}, {solution.solver}): "
                   f"{plural(len(changes), 'guest')} move, predicted {move.gain:+.3f}")
    return move
