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
from typing import TYPE_CHECKING

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.exact import NotExact, exact_layout_of, layout_changes, solve_hosts
from vmplacer.core.rebalance.pessimistic import offer_trial
from vmplacer.core.rebalance.state import ClusterState
from vmplacer.core.text import plural
from vmplacer.core.rebalance.trial import hosts_key, layout_key

if TYPE_CHECKING:
    from vmplacer.core.rebalance.search import RebalanceSearch


def explorable_hosts(search: RebalanceSearch) -> Iterator[str]:
    """Hosts an explore trial may be offered to: small enough to solve exactly, with guests and none
    of them guaranteed (a guaranteed guest is not put through a layout chosen for what is not
    known), not ruled, not moved or grouped by this plan, and without a trial of their own yet."""
    settings = search.settings
    moved_hosts = {search.host_of[g] for g in search.migrated} | set(search.migrated.values())
    grouped = {h for trial in search.draft.group_trials.values() for h in trial["hosts"]}
    for name in sorted(search.hosts):
        host = search.hosts[name]
        if (name in search.draft.trials or name in moved_hosts or name in grouped or name in search.draft.ruled or not host.guests
                or not 0 < len(host.usable) <= settings.exact_max_cpus
                or any(search.guests[g].protected for g in host.guests)):
            continue
        yield name


def offer_optimistic_layouts(search: RebalanceSearch) -> None:
    """Offer each small host without a trial its optimistic exact layout as the trial."""
    settings = search.settings
    if (not settings.trials or settings.exploration <= 0 or search.solver is None or search.betas.empty):
        return
    for name in explorable_hosts(search):
        if search.history.tried.get(name, 0) >= settings.trial_max:
            continue
        host = search.hosts[name]
        optimist = _optimist(search, [name])
        layout = exact_layout_of(optimist, search.solver, name, settings.exact_time_s)
        if layout is None:
            continue
        here = {g: dict(host.pins[g]) for g in layout}
        if here == layout or what_if_gain(optimist, name, layout) < search.min_gain_on([name]):
            continue  # nothing the optimist would gain by (a layout as good as this one, relabelled)
        offer_trial(search, name, {"here": layout_key(name, here)}, "here", layout, "optimistic",
                     "layout the model would choose were its doubtful pairs harmless")


def offer_optimistic_groups(search: RebalanceSearch) -> None:
    """Offer each group of small hosts solved together, that the plan leaves alone, its optimistic
    joint layout as their trial when it moves a guest to another host."""
    settings = search.settings
    if (not settings.trials or settings.exploration <= 0 or search.solver is None or search.betas.empty
            or not settings.allow_migration):
        return
    touched_hosts = {search.host_of[g] for g in search.touched} | {
        search.original[g].placement.host for g in search.touched}
    for group in search._exact_groups():
        if (len(group) < 2 or any(h in search.draft.trials or h in touched_hosts or h in search.draft.ruled for h in group)
                or any(search.history.tried.get(h, 0) >= settings.trial_max for h in group)):
            continue
        guests = [g for h in group for g in search.hosts[h].guests]
        if not guests or any(search.guests[g].protected for g in guests):
            continue
        optimist = _optimist(search, group)
        try:
            problem, solution = solve_hosts(optimist, search.solver, group, settings.exact_time_s)
        except NotExact:
            continue
        if solution is None:
            continue
        wanted = layout_changes(optimist, problem, solution)
        if not any(host != optimist.host_of[g] for g, (host, _) in wanted.items()):
            continue  # no guest changes host: each host's own exploration reaches it
        move = optimist._relayout_move(problem, solution, group, {})
        if move is None or move.gain < settings.min_migration_gain:
            continue  # not worth its migrations even to the optimist
        _offer_group_trial(search, group, {c.guest: (c.host, dict(c.pins)) for c in move.changes}, move.gain)


def _offer_group_trial(search: RebalanceSearch, group: list[str], changes: dict, gain: float) -> None:
    """Note the joint layout to try, unless a measurement already compared it with where the hosts are."""
    here = {g: (h, dict(search.hosts[h].pins[g])) for h in group for g in search.hosts[h].guests}
    there = {**here, **changes}
    from_key, to_key = hosts_key(group, here), hosts_key(group, there)
    if from_key == to_key or (from_key, to_key) in search.history.measured_better or (to_key, from_key) in search.history.measured_better:
        return
    label = "+".join(group)
    search.draft.group_trials[label] = {
        "hosts": list(group), "changes": changes, "what": "optimistic", "from_key": from_key, "to_key": to_key,
        "label": (f"joint layout of {', '.join(group)} the model would choose were its doubtful pairs harmless "
                  f"({plural(len(changes), 'guest')} move, "
                  f"{sum(1 for g, (h, _) in changes.items() if h != here[g][0])} "
                  f"to another host; optimistic {gain:+.3f})")}


def _optimist(search: RebalanceSearch, host_names: list[str]):
    """A what-if search of `host_names` as the plan leaves them, under optimistic coefficients
    (each β lowered by `exploration` standard deviations), pinning what the plan may pin."""
    guests = [g for h in host_names for g in search.hosts[h].guests]
    state = ClusterState({h: search.hosts[h].state for h in host_names},
                         {g: _at_plan_end(search, g, search.guests[g]) for g in guests})
    optimist = type(search)(state, search.model, search.settings, None, {}, None, search.solver,
                            optimism=search.settings.exploration,
                            history=RunHistory.of(pooled=[g for g in guests if search.may_pin(g)]))
    optimist.refused_by = search.refused_by
    return optimist


def _at_plan_end(search: RebalanceSearch, name: str, guest):
    """The guest as the plan leaves it (its pins on the what-if host; movable as before)."""
    placement = search._current_placement(name)
    return replace(guest, placement=placement, host=placement.host)


def what_if_gain(search: RebalanceSearch, name: str, layout) -> float:
    """How much better `layout` is than host `name` as it is, by the coefficients of `search` (a
    what-if search: the optimistic one here); -inf when it
    breaks a rule."""
    host = search.hosts[name]
    move = search.new_move("relayout", [(g, name, pins) for g, pins in layout.items()])
    before = search.host_objective(host)
    undo = search._try(move)
    try:
        after = search.host_objective(host)
        broken = search.violations(host, list(layout))
    finally:
        undo()
    return -float("inf") if broken else after - before
