"""The rebalance policy's local search: the first draft, and the climb that takes moves on it.

Steepest ascent on the draft's what-if host layouts (`rebalance/layout`): each round every
host offers its best local move (`rebalance/local_moves`: move, swap, pool/unpool,
relocate) and the cluster its best migration (`rebalance/migration`); the best one that
clears the hysteresis and fits the action budget is applied to the draft. Only the hosts
a move changed offer again. The search only records moves; `rebalance/actions` turns them
into a plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.rebalance.budget import budget_cells, host_work_limit
from vmplacer.core.rebalance.draft import NO_HISTORY, Draft, PlanInputs, RunHistory, Stage
from vmplacer.core.rebalance.layout import BetaTable, HostLayout
from vmplacer.core.rebalance.layout_problem import LayoutSolver
from vmplacer.core.rebalance.local_moves import LocalOffer, local_offer
from vmplacer.core.rebalance.migration import best_migration
from vmplacer.core.rebalance.state import FIXED, FLOATING, PINNED, ClusterState, RebalanceSettings
from vmplacer.core.rebalance.whatif import (
    EPS,
    CandidateMove,
    host_perf,
    judge,
    may_pin,
    perf_by_guest,
    relocated_cells,
)
from vmplacer.core.stage_times import NO_STAGE_TIMES, StageTimes


def start_search(state: ClusterState, model: InterferenceModel, settings: RebalanceSettings,
                 now: float | None = None, last_moved: Mapping[str, float] | None = None,
                 scope: Iterable[str] | None = None, solver: LayoutSolver | None = None, *,
                 optimism: float = 0.0, history: RunHistory = NO_HISTORY,
                 times: StageTimes = NO_STAGE_TIMES) -> tuple[Draft, PlanInputs]:
    """The first draft (every host laid out as it is) and the inputs every stage reads.

    Guests outside `scope`, or moved within the cool-down (`now`, `last_moved`: guest ->
    epoch seconds of its last move), are fixed where they are; `optimism` > 0 lowers each
    coefficient by that many standard deviations (exploration)."""
    betas = BetaTable(model, optimism, keep_cells=budget_cells(settings))
    draft = Draft(hosts={name: HostLayout(host, betas) for name, host in state.hosts.items()})
    scope_set = set(scope) if scope is not None else None
    last_moved = last_moved or {}
    for guest in state.guests.values():
        if guest.mode != FIXED:
            why = ""
            if scope_set is not None and guest.name not in scope_set:
                why = "outside the rebalancing scope"
            elif now is not None and guest.name in last_moved and now - last_moved[guest.name] < settings.cooldown_s:
                why = f"moved {now - last_moved[guest.name]:.0f} s ago (cool-down {settings.cooldown_s:g} s)"
            elif 0 < settings.max_moves_per_guest_hour <= history.moves.get(guest.name, 0):
                why = (f"moved {history.moves[guest.name]} times in the last hour "
                       f"(max_moves_per_guest_hour {settings.max_moves_per_guest_hour})")
            if why:
                guest = guest.fixed(why)
        draft.guests[guest.name] = guest
        draft.hosts[guest.host].add(guest, guest.placement.vcpupin)
    draft.host_of = {g.name: g.host for g in draft.guests.values()}
    refused_by: dict[str, set[str]] = {}
    for guest in draft.guests.values():
        for peer in guest.anti_affinity:
            refused_by.setdefault(peer, set()).add(guest.name)
    draft.memory_nodes = {g.name: g.placement.memory_nodes for g in draft.guests.values()}
    start_perf = perf_by_guest(draft)
    floors: dict[str, float] = {}
    for guest in draft.guests.values():
        if guest.floor is not None:
            floors[guest.name] = guest.floor
        elif guest.protected:
            floors[guest.name] = start_perf.get(guest.name, 0.0)
    draft.perf_now = dict(start_perf)
    inputs = PlanInputs(state=state, model=model, settings=settings, betas=betas, original=dict(draft.guests),
                        start_perf=start_perf, floors=floors,
                        refused_by={peer: frozenset(names) for peer, names in refused_by.items()},
                        solver=solver, history=history, times=times)
    return draft, inputs


def apply_move(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> None:
    for change in move.changes:
        name = change.guest
        old_host = draft.hosts[draft.host_of[name]]
        guest = draft.guests[name]
        if change.host != old_host.name:
            old_host.remove(name)
            draft.migrated.setdefault(name, guest.host)
            base = change.placement or replace(guest.placement, host=change.host)
            guest = replace(guest, host=change.host, placement=replace(base, host=change.host))
            draft.guests[name] = guest
            draft.hosts[change.host].add(guest, change.pins)
            draft.host_of[name] = change.host
            if change.memory_nodes is not None:
                draft.memory_nodes[name] = change.memory_nodes
        else:
            old_host.set_pins(name, change.pins)
            if change.memory_nodes is not None:
                draft.memory_nodes[name] = change.memory_nodes
                draft.memory_moved.add(name)
                # later moves keep its vCPUs where its memory now is
                placement = replace(guest.placement, memory_nodes=change.memory_nodes,
                                    cells=relocated_cells(guest.placement, change.memory_nodes))
                draft.guests[name] = replace(guest, placement=placement)
                old_host.guests[name] = draft.guests[name]
        if move.kind == "pool":
            draft.guests[name] = replace(draft.guests[name], mode=FLOATING)
            draft.hosts[draft.host_of[name]].guests[name] = draft.guests[name]
        elif may_pin(draft, inputs, name) and all(len(p) == 1 for p in change.pins.values()):
            draft.guests[name] = replace(draft.guests[name], mode=PINNED)
            draft.hosts[draft.host_of[name]].guests[name] = draft.guests[name]
        draft.touched.add(name)
    draft.moves.append(move)


def actions_if(draft: Draft, move: CandidateMove) -> int:
    touched = draft.touched | {c.guest for c in move.changes}
    migrated = set(draft.migrated) | {c.guest for c in move.changes if c.host != draft.host_of[c.guest]}
    memory = draft.memory_moved | ({c.guest for c in move.changes} if move.kind == "relocate" else set())
    return len(touched) + len(migrated) + len(memory)


def run_stages(draft: Draft, inputs: PlanInputs, stages: Iterable[Stage]) -> Draft:
    """Each stage in turn refines the draft, timed under its name (core/rebalance/policy.py
    `PIPELINE` lists them in order)."""
    for stage in stages:
        with inputs.times.stage(stage.name):
            draft = stage.refine(draft, inputs)
    return draft


def climb(draft: Draft, inputs: PlanInputs) -> None:
    """Stage: steepest ascent — single moves, swaps, pools, relocations, migrations — until no
    move clears its threshold or the action budget is spent."""
    climb_until_stuck(draft, inputs)


def climb_until_stuck(draft: Draft, inputs: PlanInputs) -> None:
    settings = inputs.settings
    offers: dict[str, LocalOffer | None] = {}
    dirty = set(draft.hosts)
    migration: CandidateMove | None = None
    migration_dirty = True
    limit = host_work_limit(settings)
    for _ in range(settings.max_rounds):
        for name in dirty:
            host = draft.hosts[name]
            if host.work > limit:  # anytime: the moves taken on it stand, no more are looked for
                offers[name] = None
                draft.cut_short.setdefault(name, f"host {name}: search stopped after its budget of "
                                                 f"{settings.host_budget_s:g} s (rebalance.search.host_budget_s); "
                                                 "the moves found until then are planned")
                continue
            offers[name] = local_offer(draft, inputs, host)
        dirty = set()
        if migration_dirty:
            migration = best_migration(draft, inputs)
            migration_dirty = False
        chosen, surest = _pick(draft, inputs, offers, migration)
        if chosen is None:
            if surest is not None:
                draft.rejected.append(f"action budget of {settings.max_actions} reached")
                decline(draft, inputs, surest, threshold_of(draft, inputs, surest), "max_actions")
            else:
                best = _largest_gain(draft, inputs, offers, migration)
                if best is not None:
                    decline(draft, inputs, best, threshold_of(draft, inputs, best))
            return
        dirty |= take_move(draft, inputs, chosen)
        migration_dirty = True


_MARGIN = 1e-9  # sure gains and their bounds are sums of the same floats in another order


def _pick(draft: Draft, inputs: PlanInputs, offers: Mapping[str, LocalOffer | None],
          migration: CandidateMove | None) -> tuple[CandidateMove | None, CandidateMove | None]:
    """(the move to take; when none fits the action budget, the surest move that clears its
    threshold, or None). The answer of judging every host's move, sorting those that clear their
    threshold by sure gain (ties: the host listed first, the migration last) and taking the first
    that fits the budget — judging only the offers whose bound could change it."""
    settings = inputs.settings
    fit = best = None  # (sure gain, -position, move): larger is better
    if migration is not None and judge(draft, inputs, migration) >= settings.min_migration_gain:
        best = (migration.sure_gain, -len(offers), migration)
        if actions_if(draft, migration) <= settings.max_actions:
            fit = best
    ranked = sorted(((offer.bound, position, offer) for position, offer in enumerate(offers.values())
                     if offer is not None), key=lambda item: (-item[0], item[1]))
    for bound, position, offer in ranked:
        if fit is not None and bound + _MARGIN < fit[0]:
            break  # no offer from here on can be surer than the move to take
        may_fit = any(actions_if(draft, c) <= settings.max_actions for c in offer.contenders)
        may_lead = fit is None and (best is None or bound + _MARGIN >= best[0])
        if not may_fit and not may_lead:
            continue
        move = offer.move(draft, inputs)
        if judge(draft, inputs, move) < threshold_of(draft, inputs, move) or held_back(draft, inputs, move):
            continue
        entry = (move.sure_gain, -position, move)
        if best is None or entry[:2] > best[:2]:
            best = entry
        if actions_if(draft, move) <= settings.max_actions and (fit is None or entry[:2] > fit[:2]):
            fit = entry
    if fit is not None:
        return fit[2], None
    return None, best[2] if best is not None else None


def _largest_gain(draft: Draft, inputs: PlanInputs, offers: Mapping[str, LocalOffer | None],
                  migration: CandidateMove | None) -> CandidateMove | None:
    """The largest predicted gain among the hosts' moves and the migration (the first host listed,
    on a tie), judging only the offers that could hold it: the plan names it as declined."""
    best = None  # (gain, -position, move)
    if migration is not None and migration.gain > EPS:
        best = (migration.gain, -len(offers), migration)
    for position, offer in enumerate(offers.values()):
        if offer is None or (best is not None and offer.most_gain < best[0]):
            continue
        move = offer.move(draft, inputs)
        if move.gain > EPS and (best is None or (move.gain, -position) > best[:2]):
            best = (move.gain, -position, move)
    return best[2] if best is not None else None


def take_move(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> set[str]:
    """Apply a move to the what-if state; the hosts it changed."""
    hosts = {draft.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes}
    apply_move(draft, inputs, move)
    # A guest's predicted performance depends on its own host's layout only: re-read the hosts
    # the move changed (guests that left them are re-read on the host they went to).
    for name in hosts:
        draft.perf_now.update(host_perf(draft.hosts[name]))
    return hosts


def held_back(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> bool:
    """A move the model's data drive (its interference change reaches `min_gain`) on a host in
    back-off: not planned; the host's layout may only be tried (kept if measured better)."""
    if not inputs.history.held:
        return False
    hosts = {draft.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes}
    return bool(hosts & set(inputs.history.held)) and abs(move.gain - move.linear_gain) >= min_gain_on(draft, inputs, hosts)


def threshold_of(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> float:
    """The gain a move must clear: `min_migration_gain` when a guest changes host, else the
    hysteresis of the hosts it touches (`min_gain`, lower on hosts of few guests)."""
    if any(c.host != draft.host_of[c.guest] for c in move.changes):
        return inputs.settings.min_migration_gain
    return min_gain_on(draft, inputs, {draft.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes})


def min_gain_on(draft: Draft, inputs: PlanInputs, hosts) -> float:
    """The hysteresis of a move on `hosts` (RebalanceSettings.min_gain_for their guests)."""
    weight = sum(draft.guests[g].weight for h in set(hosts) for g in draft.hosts[h].guests)
    return inputs.settings.min_gain_for(weight)


def decline(draft: Draft, inputs: PlanInputs, move: CandidateMove, threshold: float, by: str | None = None) -> None:
    """Remember a gain left on the table and what declined it (the plan says so)."""
    judge(draft, inputs, move)
    paid = move.cost.get("paid", 0.0)
    if by is None:
        if held_back(draft, inputs, move) and move.gain >= threshold:
            by = "backoff"
        elif move.gain + paid >= threshold > move.gain:
            by = "migration_cost"
        elif move.gain >= threshold > move.sure_gain:
            by = "confidence"
        else:
            by = "min_migration_gain" if threshold == inputs.settings.min_migration_gain and any(
                c.host != draft.host_of[c.guest] for c in move.changes) else "min_gain"
    draft.declined.append({
        "kind": move.kind, "move": move.reason, "guests": sorted({c.guest for c in move.changes}),
        "predicted_gain": round(move.gain, 4), "sure_gain": round(move.sure_gain, 4),
        "confidence": round(move.confidence, 3), "cost": round(paid, 4), "threshold": threshold,
        "declined_by": by,
    })
