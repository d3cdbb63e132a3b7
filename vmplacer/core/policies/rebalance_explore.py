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
"""

from __future__ import annotations

from dataclasses import replace

from vmplacer.core.policies.rebalance_exact import NotExact, solve_hosts, solved_layout
from vmplacer.core.policies.rebalance_pessimistic import offer_trial
from vmplacer.core.policies.rebalance_state import ClusterState
from vmplacer.core.trial import layout_key


def offer_optimistic_layouts(search) -> None:
    """Offer each small host without a trial its optimistic exact layout as the trial."""
    settings = search.settings
    if (not settings.trials or settings.exploration <= 0 or search.solver is None or search.betas.empty):
        return
    moved_hosts = {search.host_of[g] for g in search.migrated} | set(search.migrated.values())
    for name in sorted(search.hosts):
        host = search.hosts[name]
        if (name in search.trials or name in moved_hosts or name in search.ruled or not host.guests
                or not 0 < len(host.usable) <= settings.exact_max_cpus
                or search.tried.get(name, 0) >= settings.trial_max):
            continue
        if any(search.guests[g].protected for g in host.guests):
            continue  # a guaranteed guest is not put through a layout chosen for what is not known
        guests = {g: search.guests[g] for g in host.guests}
        state = ClusterState({name: host.state},
                             {g: _at_plan_end(search, g, guest) for g, guest in guests.items()})
        optimist = type(search)(state, search.model, settings, None, {}, None, search.solver,
                                optimism=settings.exploration)
        optimist.pooled = {g for g in guests if search.may_pin(g)}
        optimist.refused_by = search.refused_by
        try:
            problem, solution = solve_hosts(optimist, search.solver, [name], settings.exact_time_s)
        except NotExact:
            continue
        if solution is None:
            continue
        layout = solved_layout(problem, solution)
        here = {g: dict(host.pins[g]) for g in layout}
        if here == layout or _optimistic_gain(optimist, name, layout) < search.min_gain_on([name]):
            continue  # nothing the optimist would gain by (a layout as good as this one, relabelled)
        offer_trial(search, name, {"here": layout_key(name, here)}, "here", layout, "optimistic",
                     "layout the model would choose were its doubtful pairs harmless")


def _at_plan_end(search, name: str, guest):
    """The guest as the plan leaves it (its pins on the what-if host; movable as before)."""
    placement = search._current_placement(name)
    return replace(guest, placement=placement, host=placement.host)


def _optimistic_gain(optimist, name: str, layout) -> float:
    """How much better `layout` is than the host as it is, by the optimistic coefficients; -inf
    when it breaks a rule."""
    host = optimist.hosts[name]
    move = optimist.new_move("relayout", [(g, name, pins) for g, pins in layout.items()])
    before = optimist.host_objective(host)
    undo = optimist._try(move)
    try:
        after = optimist.host_objective(host)
        broken = optimist.violations(host, list(layout))
    finally:
        undo()
    return -float("inf") if broken else after - before
