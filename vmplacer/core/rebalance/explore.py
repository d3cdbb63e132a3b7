"""Exploration: a trial of the layout the model would choose were its doubtful pairs harmless.

The model's prior and its additive form can fear a pairing that is in fact good
(two guests of one workload on SMT siblings of a module-shared core, say), and
a layout the model fears is never planned, so never measured, so the fear is
never refuted: the lower bound guards against the model's optimism, nothing
against its pessimism. A host that ends a plan with no other trial therefore
tries the exact solver's layout under optimistic coefficients — each β lowered
by `exploration` standard deviations of what it may be wrong by, never below
min(β, 0) — when that layout differs from the plan's. Like every trial it is
kept only when Freeze'nSense measures it better, remembered either way, and
counted against the host's `trial_max`; pairs the data back move little, so
the layout differs only where the data are thin. Hosts running a protected guest
(a floor, a priority, latency-critical) are not explored.

Small hosts the exact solver takes together (their pCPUs within `exact_max_cpus`)
are explored together first: a layout the prior fears across hosts (three guests
on one host, the fourth alone) is never planned either, and one host's trial
cannot reach it. When their optimistic joint layout moves a guest to another
host and the plan leaves those hosts alone, the migrations and repins to it are
the trial, measured on every host of the group at once and judged as one (the
guests that moved count on both sides); undone, the guests migrate back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from vmplacer.core.rebalance.draft import Draft, PlanInputs, RunHistory
from vmplacer.core.rebalance.exact import (
    NotExact,
    exact_groups,
    exact_layout_of,
    layout_changes,
    relayout_move,
    solve_hosts,
)
from vmplacer.core.rebalance.offers import GroupTrial, TrialKind
from vmplacer.core.rebalance.pessimistic import offer_trial
from vmplacer.core.rebalance.state import ClusterState
from vmplacer.core.text import plural
from vmplacer.core.rebalance.search import min_gain_on, start_search
from vmplacer.core.rebalance.trial import hosts_key, layout_key
from vmplacer.core.rebalance.whatif import current_placement, host_objective, may_pin, new_move, try_move, violations


def explorable_hosts(draft: Draft, inputs: PlanInputs) -> Iterator[str]:
    """Hosts an explore trial may be offered to: small enough to solve exactly, with guests and none
    of them guaranteed (a guaranteed guest is not put through a layout chosen for what is not
    known), not ruled, not moved or grouped by this plan, and without a trial of their own yet."""
    settings = inputs.settings
    moved_hosts = {draft.host_of[g] for g in draft.migrated} | set(draft.migrated.values())
    grouped = {h for trial in draft.group_trials.values() for h in trial.hosts}
    for name in sorted(draft.hosts):
        host = draft.hosts[name]
        if (name in draft.trials or name in moved_hosts or name in grouped or name in draft.ruled or not host.guests
                or not 0 < len(host.usable) <= settings.exact_max_cpus
                or any(draft.guests[g].protected for g in host.guests)):
            continue
        yield name


def offer_optimistic_layouts(draft: Draft, inputs: PlanInputs) -> None:
    """Offer each small host without a trial its optimistic exact layout as the trial."""
    settings = inputs.settings
    if (not settings.trials or settings.exploration <= 0 or inputs.solver is None or inputs.betas.empty):
        return
    for name in explorable_hosts(draft, inputs):
        if inputs.history.tried.get(name, 0) >= settings.trial_max:
            continue
        host = draft.hosts[name]
        optimist = _optimist(draft, inputs, [name])
        layout = exact_layout_of(*optimist, inputs.solver, name, settings.exact_time_s)
        if layout is None:
            continue
        here = {g: dict(host.pins[g]) for g in layout}
        gain = what_if_gain(*optimist, name, layout)
        if here == layout or gain < min_gain_on(draft, inputs, [name]):
            continue  # nothing the optimist would gain by (a layout as good as this one, relabelled)
        offer_trial(draft, inputs, name, {"here": layout_key(name, here)}, "here", layout, TrialKind.OPTIMISTIC,
                     "layout the model would choose were its doubtful pairs harmless", value=gain)


def offer_optimistic_groups(draft: Draft, inputs: PlanInputs) -> None:
    """Offer each group of small hosts solved together, that the plan leaves alone, its optimistic
    joint layout as their trial when it moves a guest to another host."""
    settings = inputs.settings
    if (not settings.trials or settings.exploration <= 0 or inputs.solver is None or inputs.betas.empty
            or not settings.allow_migration):
        return
    touched_hosts = {draft.host_of[g] for g in draft.touched} | {
        inputs.original[g].placement.host for g in draft.touched}
    for group in exact_groups(draft, inputs):
        if (len(group) < 2 or any(h in draft.trials or h in touched_hosts or h in draft.ruled for h in group)
                or any(inputs.history.tried.get(h, 0) >= settings.trial_max for h in group)):
            continue
        guests = [g for h in group for g in draft.hosts[h].guests]
        if not guests or any(draft.guests[g].protected for g in guests):
            continue
        optimist_draft, optimist = _optimist(draft, inputs, group)
        try:
            problem, solution = solve_hosts(optimist_draft, optimist, inputs.solver, group, settings.exact_time_s)
        except NotExact:
            continue
        if solution is None:
            continue
        wanted = layout_changes(optimist_draft, optimist, problem, solution)
        if not any(host != optimist_draft.host_of[g] for g, (host, _) in wanted.items()):
            continue  # no guest changes host: each host's own exploration reaches it
        move = relayout_move(optimist_draft, optimist, problem, solution, group, {})
        if move is None or move.gain < settings.min_migration_gain:
            continue  # not worth its migrations even to the optimist
        _offer_group_trial(draft, inputs, group, {c.guest: (c.host, dict(c.pins)) for c in move.changes}, move.gain)


def _offer_group_trial(draft: Draft, inputs: PlanInputs, group: list[str], changes: dict, gain: float) -> None:
    """Note the joint layout to try, unless a measurement already compared it with where the hosts are."""
    here = {g: (h, dict(draft.hosts[h].pins[g])) for h in group for g in draft.hosts[h].guests}
    there = {**here, **changes}
    from_key, to_key = hosts_key(group, here), hosts_key(group, there)
    if from_key == to_key or (from_key, to_key) in inputs.history.measured_better or (to_key, from_key) in inputs.history.measured_better:
        return
    trial = GroupTrial(
        tuple(group), changes, TrialKind.OPTIMISTIC,
        (f"joint layout of {', '.join(group)} the model would choose were its doubtful pairs harmless "
         f"({plural(len(changes), 'guest')} move, "
         f"{sum(1 for g, (h, _) in changes.items() if h != here[g][0])} "
         f"to another host; optimistic {gain:+.3f})"),
        from_key, to_key, max(float(gain), 0.0))
    draft.group_trials[trial.name] = trial


def _optimist(draft: Draft, inputs: PlanInputs, host_names: list[str]) -> tuple[Draft, PlanInputs]:
    """A what-if search of `host_names` as the plan leaves them, under optimistic coefficients
    (each β lowered by `exploration` standard deviations), pinning what the plan may pin."""
    guests = [g for h in host_names for g in draft.hosts[h].guests]
    state = ClusterState({h: draft.hosts[h].state for h in host_names},
                         {g: _at_plan_end(draft, inputs, g, draft.guests[g]) for g in guests})
    optimist_draft, optimist = start_search(
        state, inputs.model, inputs.settings, solver=inputs.solver, optimism=inputs.settings.exploration,
        history=RunHistory.of(pooled=[g for g in guests if may_pin(draft, inputs, g)]))
    return optimist_draft, replace(optimist, refused_by=inputs.refused_by)


def _at_plan_end(draft: Draft, inputs: PlanInputs, name: str, guest):
    """The guest as the plan leaves it (its pins on the what-if host; movable as before)."""
    placement = current_placement(draft, name)
    return replace(guest, placement=placement, host=placement.host)


def what_if_gain(draft: Draft, inputs: PlanInputs, name: str, layout) -> float:
    """How much better `layout` is than host `name` as it is, by the coefficients of `search` (a
    what-if search: the optimistic one here); -inf when it
    breaks a rule."""
    host = draft.hosts[name]
    move = new_move("relayout", [(g, name, pins) for g, pins in layout.items()])
    before = host_objective(inputs, host)
    undo = try_move(draft, move)
    try:
        after = host_objective(inputs, host)
        broken = violations(draft, host, list(layout))
    finally:
        undo()
    return -float("inf") if broken else after - before
