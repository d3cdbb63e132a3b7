"""A second opinion on a host where the model's planned layouts measured worse lately.

The two forms of the interference model (core/model/interference.py) read the same
samples differently where neighbours pile up: the additive sum passes 1 on a
crowded host and stops telling its layouts apart, the multiplicative rate
overstates what time-sharing neighbours take. Each is right on hosts where the
other is wrong, and a host where one form is wrong says so: its planned layouts
measure worse and their confirm trials are undone (`search.history.refuted`, from the
trials' memory). Such a host climbs each run to another layout the same form
overrates.

On such a host the model fitted in the other form (`search.history.second`, on the same
samples) is asked, once per layout: its exact layout of the host, from where the
host started, becomes the host's trial (kept only when Freeze'nSense measures it
better, remembered either way, within `trial_max`) when it predicts it better
than the start by `min_gain` and no trial measured it lately. Where the plan
moves the host too and the second form rates that layout at least as high as the
start, the plan stands (its confirm trial judges it); where it rates it lower,
the host stays for the trial (the form that planned it was refuted there). Once
the second form's layout was measured, the host is planned as before: one
refuted plan does not make the next one wrong. Hosts never refuted, or runs with
no second model, are planned as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmplacer.core.rebalance.draft import RunHistory
from vmplacer.core.rebalance.exact import exact_layout_of
from vmplacer.core.rebalance.explore import what_if_gain
from vmplacer.core.rebalance.pessimistic import _restore_modes, compare_layout, offer_trial
from vmplacer.core.rebalance.state import ClusterState
from vmplacer.core.rebalance.trial import layout_key

if TYPE_CHECKING:
    from vmplacer.core.rebalance.search import RebalanceSearch


def consult_second_opinion(search: RebalanceSearch) -> None:
    """For each refuted small host, the second form's exact layout from where the host started
    becomes its trial, once: unless it was measured either way lately, the budget is spent, the
    second form rates it less than `min_gain` above the start, or the second form rates the
    plan's own layout for the host at least as high as the start (the plan stands then, and its
    confirm trial judges it). A host the plan moved returns to its start for the trial."""
    settings = search.settings
    if (not settings.second_opinion or search.history.second is None or search.solver is None or not settings.trials
            or not search.history.refuted):
        return
    moved_hosts = {search.host_of[g] for g in search.migrated} | set(search.migrated.values())
    for name in sorted(search.history.refuted):
        host = search.hosts.get(name)
        if (host is None or not host.guests or name in moved_hosts or name in search.draft.ruled
                or not 0 < len(host.usable) <= settings.exact_max_cpus
                or search.history.tried.get(name, 0) >= settings.trial_max
                or any(search.guests[g].protected for g in host.guests)):
            continue
        guests = sorted(host.guests)
        start = {g: dict(search.original[g].placement.vcpupin) for g in guests}
        other = _second_search(search, name)
        if other.betas.empty:
            continue
        solved = exact_layout_of(other, search.solver, name, settings.exact_time_s)
        if solved is None:
            continue
        layout = {g: dict(pins) for g, pins in solved.items()}
        layout = {g: layout.get(g, start[g]) for g in guests}
        here, there = layout_key(name, start), layout_key(name, layout)
        if (layout == start or (here, there) in search.history.measured_better or (there, here) in search.history.measured_better
                or what_if_gain(other, name, layout) < search.min_gain_on([name])):
            continue
        planned = {g: dict(host.pins[g]) for g in guests}
        if planned != start and what_if_gain(other, name, planned) >= 0:
            continue  # the second form does not rate the plan below the start: the plan stands
        stays = planned != start
        if stays and not _return_to_start(search, name, guests, start, other.betas.form):
            continue
        search.draft.second_opinions.append({"host": name, "form": other.betas.form, "stays": stays,
                                       "predicted_gain": round(what_if_gain(other, name, layout), 4)})
        search.draft.trials.pop(name, None)
        offer_trial(search, name, {"here": here}, "here", layout, "second",
                    f"layout the model's {other.betas.form} form would choose (its planned layouts "
                    "measured worse lately)")


def _second_search(search: RebalanceSearch, name: str):
    """A what-if search of host `name` as it started, under the second model."""
    guests = list(search.hosts[name].guests)
    state = ClusterState({name: search.hosts[name].state}, {g: search.original[g] for g in guests})
    other = type(search)(state, search.history.second, search.settings, None, {}, None, search.solver,
                         history=RunHistory.of(pooled=[g for g in guests if search.may_pin(g)]))
    other.refused_by = search.refused_by
    return other


def _return_to_start(search: RebalanceSearch, name: str, guests: list[str], start, form: str) -> bool:
    """The host goes back where it started (the plan's moves on it are dropped); False when
    that breaks a rule."""
    host = search.hosts[name]
    found = compare_layout(search, host, start, "stay")
    if found is None:
        return False
    _, _, move = found
    move.reason = (f"{name} stays as it is: its planned layouts measured worse lately, and the model's "
                   f"{form} form rates this plan's layout below the one it is at")
    search._take(move)
    _restore_modes(search, host, guests)
    return True
