"""Exploration's second look: the single step likeliest to measure better.

Exploration (rebalance/explore) tries the layout the model would choose were
its doubtful pairs harmless. Optimism is largest where a coefficient is both
large and doubtful, so on a host with a heavy stack of time-sharing guests it
keeps proposing layouts that put one more guest beside the stack, and those
measure worse; a host spends its `trial_max` layouts a day on them and then
tries nothing more, however wrong the model was shown to be. A good pairing
the model merely fears (never measured, rated a little worse) is never tried.

So a host whose explore trials within the trial memory all measured worse gets
up to `step_trials` more, each a single step of the layout it is at — one
pinned vCPU moved to another pCPU, or two swapped — chosen by how likely it is
to measure better, not by how good it could be: among the steps the optimist
would take (the predicted gain plus `exploration` standard deviations of what
the changed pair terms may be wrong by clears the host's minimum gain), the one
whose predicted gain is the most standard deviations above zero. Like every
explore trial it is kept only when Freeze'nSense measures it better, remembered
either way (a measured step is not tried again), and counted against the host's
trials; a host that found a better layout by exploring does not get these.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vmplacer.core.rebalance.explore import explorable_hosts
from vmplacer.core.rebalance.pessimistic import compare_layout, offer_trial
from vmplacer.core.rebalance.state import EXCLUSIVE, PINNED
from vmplacer.core.rebalance.trial import layout_key

if TYPE_CHECKING:
    from vmplacer.core.rebalance.search import RebalanceSearch

Layout = dict[str, dict[int, frozenset[int]]]


def offer_likeliest_steps(search: RebalanceSearch) -> None:
    """Offer each small host whose exploration found nothing its likeliest single step as the trial."""
    settings = search.settings
    if not settings.trials or settings.exploration <= 0 or settings.step_trials <= 0:
        return
    for name in explorable_hosts(search):
        tried = search.history.tried.get(name, 0)
        spent = settings.trial_max <= tried < settings.trial_max + settings.step_trials
        if not spent or search.history.explore_kept.get(name, 0):
            continue  # only where exploration's own budget is spent and found nothing
        host = search.hosts[name]
        here = pinned_layout(search, host)
        here_key = layout_key(name, here)
        for z, gain, layout in ranked_steps(search, host, here):
            there_key = layout_key(name, layout)
            if (here_key, there_key) in search.history.measured_better or (there_key, here_key) in search.history.measured_better:
                continue
            offer_trial(search, name, {"here": here_key}, "here", layout, "step",
                        f"single step likeliest to measure better (predicted {gain:+.3f}, {z:+.2f} sd)",
                        budget=settings.trial_max + settings.step_trials)
            break


def pinned_layout(search: RebalanceSearch, host) -> Layout:
    """The host's movable guests pinned one pCPU per vCPU, as they are: what a step may change."""
    return {g: dict(host.pins[g]) for g in sorted(host.guests)
            if search.movable(g) and search.guests[g].mode in (PINNED, EXCLUSIVE)
            and all(len(p) == 1 for p in host.pins[g].values())}


def ranked_steps(search: RebalanceSearch, host, here: Layout) -> list[tuple[float, float, Layout]]:
    """(standard deviations the predicted gain is above zero, predicted gain, layout) of every single
    step the optimist would take, likeliest first; steps that break a rule are left out."""
    bar = search.min_gain_on([host.name])
    ranked = []
    for layout in single_steps(host, here):
        found = compare_layout(search, host, layout, "step")
        if found is None:
            continue
        advantage_here, spread, _ = found
        gain = -advantage_here
        if gain + search.settings.exploration * spread < bar:
            continue  # not even the optimist would take it
        z = gain / spread if spread > 0 else math.copysign(math.inf, gain)
        ranked.append((z, gain, layout))
    ranked.sort(key=lambda item: (-item[0], -item[1], layout_key(host.name, item[2])))
    return ranked


def single_steps(host, here: Layout) -> list[Layout]:
    """Every layout one step from `here`: one vCPU moved to a pCPU its rules allow, or two vCPUs of
    different guests on different pCPUs swapped (the swap's rules are checked by the comparison)."""
    pieces = [(g, v, next(iter(p))) for g, pins in here.items() for v, p in sorted(pins.items())]
    steps = []
    for guest, vcpu, cpu in pieces:
        for target in sorted(host.allowed(guest, vcpu) - {cpu}):
            steps.append(_with(here, [(guest, vcpu, target)]))
    for i, (guest_a, vcpu_a, cpu_a) in enumerate(pieces):
        for guest_b, vcpu_b, cpu_b in pieces[i + 1:]:
            if guest_a != guest_b and cpu_a != cpu_b:
                steps.append(_with(here, [(guest_a, vcpu_a, cpu_b), (guest_b, vcpu_b, cpu_a)]))
    return steps


def _with(here: Layout, changes: list[tuple[str, int, int]]) -> Layout:
    layout = {g: dict(p) for g, p in here.items()}
    for guest, vcpu, cpu in changes:
        layout[guest][vcpu] = frozenset({cpu})
    return layout
