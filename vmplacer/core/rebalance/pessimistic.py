"""The model's layout against the blind spread, judged pessimistically.

The search maximizes the model's prediction, and a maximum of a noisy estimate
leans toward the layouts the model overrates: those whose predicted gain rests
on coefficients it learned from few observations, or guessed. After the
search, each host's final layout F competes with the interference-blind spread
S of the same guests (each pinned vCPU on the least crowded pCPU, then core —
the rule that needs no model). F stays when its predicted advantage over S holds
at the lower confidence bound: the advantage minus `pessimism` standard
deviations of what the coefficients of the pairs whose distance differs between
F and S may be wrong by (`HostLayout.pair_spread`: few observations, or none at that
distance), or when the two are predicted equal (fewer moves). Otherwise the
host ends spread, provided the spread itself clears the plan's usual bar
against the start (a sure gain of `min_gain`); a host that starts spread (an
earlier run spread it) stays so unless the model's layout holds at the same
bound; a host whose start the model rates above the spread keeps the search's
moves. A layout backed by data keeps its gain; one whose predicted advantage
rests on few or unobserved pairs does not beat the spread.

The layout not chosen is not forgotten: it becomes the host's measured trial
(core/rebalance/trial.py), tried after the plan's moves and kept only if Freeze'nSense
measures it better; what earlier trials measured decides before the model does.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

from vmplacer.core.rebalance.layout import HostLayout, locality_nodes
from vmplacer.core.rebalance.state import PINNED
from vmplacer.core.rebalance.disruption import expected_improvement
from vmplacer.core.rebalance.doubt import change_sd
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.offers import HostTrial, TrialKind
from vmplacer.core.rebalance.search import actions_if, min_gain_on, take_move
from vmplacer.core.rebalance.trial import layout_key
from vmplacer.core.rebalance.whatif import (
    CandidateMove,
    floors_hold,
    host_objective,
    judge,
    linear_objective,
    new_move,
    try_move,
    violations,
)


def spread_layout(draft: Draft, inputs: PlanInputs, host: HostLayout) -> dict[str, dict[int, frozenset[int]]] | None:
    """The blind spread of the host's movable vCPUs pinned one to a pCPU at the start (guest-name
    order; the search may have pooled them since): each on the pCPU with the fewest vCPUs, then
    the emptiest core, then the emptiest LLC and NUMA node (so that on a host of many nodes the
    guests do not crowd the first nodes' caches); others count as load. None when nothing may
    move or the result breaks a rule."""
    moving = [n for n in sorted(host.guests) if inputs.original[n].mode == PINNED and draft.guests[n].movable
               and n not in draft.migrated
               and all(len(p) == 1 for p in inputs.original[n].placement.vcpupin.values())]
    if not moving:
        return None
    cpu_load: dict[int, float] = {c: 0.0 for c in host.cpus}
    for name, pins in host.pins.items():
        if name in moving:
            continue
        for cpus in pins.values():
            for c in cpus:
                cpu_load[c] = cpu_load.get(c, 0.0) + 1.0 / len(cpus)
    least = LeastLoadedPicker(cpu_load, spread_groups(host))
    layout: dict[str, dict[int, frozenset[int]]] = {}
    for name in moving:
        nodes = locality_nodes(host, host.guests[name], host.pins[name])
        allowed = tuple(sorted(c for c in host.usable if not nodes or host.node_of[c] in nodes))
        if not allowed:
            return None
        pins: dict[int, frozenset[int]] = {}
        for vcpu in sorted(host.pins[name]):
            cpu = least.pick(allowed)
            pins[vcpu] = frozenset({cpu})
            least.add(cpu, 1.0)
        layout[name] = pins
    return layout


def spread_groups(host: HostLayout) -> list[dict[int, object]]:
    """pCPU -> its core, LLC and NUMA node: the levels the blind spread balances, in that order
    (a host that reports no LLC: its node stands in)."""
    cpus = {c: host.topology.cpus[c] for c in host.cpus}
    return [{c: cpu.core for c, cpu in cpus.items()},
            {c: ("llc", cpu.llc) if cpu.llc is not None else ("node", cpu.node) for c, cpu in cpus.items()},
            {c: cpu.node for c, cpu in cpus.items()}]


class LeastLoadedPicker:
    """min(allowed, key=(its load, its core's load, its LLC's, its node's, pCPU)) over and over
    while the loads only grow: a heap per set of allowed pCPUs whose entries may lag behind (a
    lagging entry is never above its pCPU's key, so the top, once up to date, is the least of them
    all; pCPUs are distinct, so there are no ties). Every vCPU of every guest asks: a scan each
    time is what made the spread cost as much as the search's moves. `groups`: pCPU -> its group
    at each level after the pCPU itself; the loads of `cpu_load` count in each."""

    def __init__(self, cpu_load: dict[int, float], groups: list[dict[int, object]]):
        self.cpu_load, self.groups = cpu_load, groups
        self.group_load: list[dict[object, float]] = []
        for level in groups:
            loads: dict[object, float] = {}
            for cpu, load in cpu_load.items():
                loads[level[cpu]] = loads.get(level[cpu], 0.0) + load
            self.group_load.append(loads)
        self.heaps: dict[tuple[int, ...], list[tuple]] = {}

    def add(self, cpu: int, load: float) -> None:
        """`cpu` takes `load` more (a vCPU placed on it)."""
        self.cpu_load[cpu] += load
        for level, loads in zip(self.groups, self.group_load):
            loads[level[cpu]] += load

    def _key(self, cpu: int) -> tuple:
        return (self.cpu_load[cpu], *(loads[level[cpu]] for level, loads in zip(self.groups, self.group_load)), cpu)

    def pick(self, allowed: tuple[int, ...]) -> int:
        heap = self.heaps.get(allowed)
        if heap is None:
            heap = [self._key(c) for c in allowed]
            heapq.heapify(heap)
            self.heaps[allowed] = heap
        while True:
            key = self._key(heap[0][-1])
            if key == heap[0]:
                return key[-1]
            heapq.heapreplace(heap, key)


def doubt(draft: Draft, inputs: PlanInputs, move: CandidateMove) -> float:
    """Standard deviation of the move's predicted interference change: every vCPU pair whose
    term changes (who hurts whom, at which distance, with what share of time) counts the
    variance of its coefficients before and after (`doubt.change_sd`, from the changed
    vCPUs' lines alone)."""
    hosts = sorted({draft.host_of[c.guest] for c in move.changes} | {c.host for c in move.changes})
    before = [(draft.hosts[h], draft.hosts[h].pieces()) for h in hosts]
    undo = try_move(draft, move)
    try:
        after = [(draft.hosts[h], draft.hosts[h].pieces()) for h in hosts]
    finally:
        undo()
    return change_sd(before, after)


def choose_pessimistically(draft: Draft, inputs: PlanInputs) -> bool:
    """Each host ends at the model's layout, or at the blind spread when the model's advantage
    over it fails at its lower confidence bound (module docstring); True when a host was spread.
    A measurement that already compared the two (a trial of an earlier run) decides instead of
    the model. The layout not chosen becomes the host's trial (`draft.trials`): tried after the
    plan's moves and kept only when Freeze'nSense measures it better. Reports go to
    `draft.pessimistic`."""
    settings = inputs.settings
    if inputs.betas.empty:
        return False
    moved_hosts = {draft.host_of[g] for g in draft.migrated} | set(draft.migrated.values())
    changed = False
    for name in sorted(draft.hosts):
        host = draft.hosts[name]
        if name in moved_hosts:
            continue
        layout = spread_layout(draft, inputs, host)
        if layout is None:
            continue
        model_layout = {g: dict(host.pins[g]) for g in layout}
        draft.layout_guests[name] = sorted(layout)
        start = {g: dict(inputs.original[g].placement.vcpupin) for g in layout}
        keys = {"model": layout_key(name, model_layout), "spread": layout_key(name, layout),
                "start": layout_key(name, start)}
        report: dict = {"host": name}
        spread = compare_layout(draft, inputs, host, layout, "spread")
        if spread is None:  # the search ended spread (or the spread breaks a rule)
            continue
        target, (advantage, sigma, move) = "spread", spread
        # when what sets the two apart is time sharing alone (arithmetic, not a guess), the model
        # knows which is better, and a measurement would only add its noise: no trial
        trial = settings.trials and abs(move.gain - move.linear_gain) >= min_gain_on(draft, inputs, [name])
        sure = _sure_from_start(draft, inputs, host, layout)
        report["spread"] = {"advantage": round(advantage, 4), "sd": round(sigma, 4),
                            "sure_gain_from_start": round(sure, 4)}
        if (keys["spread"], keys["model"]) in inputs.history.measured_better:
            report["measured"] = "the spread measured better than the model's layout"
            bound = -math.inf
        elif (keys["model"], keys["spread"]) in inputs.history.measured_better:
            report["measured"] = "the model's layout measured better than the spread"
            bound = math.inf
        elif settings.pessimism <= 0:
            bound = math.inf
        else:
            if sure < min_gain_on(draft, inputs, [name]):
                if start != layout:  # the start is better than the spread: the model's moves from it stand
                    report["kept"] = "model (the spread does not clear the minimum gain from the start)"
                    draft.pessimistic.append(report)
                    if trial:
                        offer_trial(draft, inputs, name, keys, "model", layout, TrialKind.SPREAD, "blind spread",
                                    value=expected_improvement(-advantage, sigma))
                    continue
                # the host is spread already (an earlier run spread it): leaving it must pass the same bound
                found = compare_layout(draft, inputs, host, start, "stay")
                if found is None:
                    continue
                target, (advantage, sigma, move) = "start", found
                report["start"] = {"advantage": round(advantage, 4), "sd": round(sigma, 4)}
            bound = advantage - settings.pessimism * sigma
            report["lower_bound"] = round(bound, 4)
        draft.pessimistic.append(report)
        if bound >= 0 or (advantage <= 1e-9 and "measured" not in report):  # surely better, or no worse
            report["kept"] = "model"
            if trial and model_layout != layout:
                offer_trial(draft, inputs, name, keys, "model", layout, TrialKind.SPREAD, "blind spread",
                            value=expected_improvement(-advantage, sigma))
            continue
        if actions_if(draft, move) > settings.max_actions:
            report["kept"] = "model (action budget)"
            continue
        what = "blind spread" if target == "spread" else "starting layout"
        if "measured" in report:
            move.reason = f"{what} of {name}: {report['measured']} in an earlier trial"
        else:
            move.reason = (f"{what} of {name}: the model's layout predicted {advantage:+.3f} better, "
                           f"but not at its lower bound ({bound:+.3f}, sd {sigma:.3f})")
        take_move(draft, inputs, move)
        _restore_modes(draft, inputs, host, layout)
        report["kept"] = target
        draft.ruled.add(name)
        changed = True
        if trial and advantage > 1e-9:
            offer_trial(draft, inputs, name, keys, "spread" if target == "spread" else "start", model_layout,
                         TrialKind.MODEL, "model's layout", value=expected_improvement(advantage, sigma))
    return keep_what_measured_better(draft, inputs) or changed


def offer_declined_layouts(draft: Draft, inputs: PlanInputs) -> None:
    """An exact layout the model rates worth its threshold but whose sure gain is not, or whose
    host is in back-off (a host the pessimistic check left alone, no migration), becomes the
    host's trial when it has none: the measurement decides what the model's data could not. A
    layout measured either way lately is not tried again (`offer_trial`)."""
    if not inputs.settings.trials:
        return
    moved_hosts = {draft.host_of[g] for g in draft.migrated} | set(draft.migrated.values())
    for name, layout in sorted(draft.declined_layouts.items()):
        if name in draft.trials or name in moved_hosts or name in draft.ruled:
            continue
        host = draft.hosts[name]
        if any(g not in host.guests for g in layout):
            continue
        here = {g: dict(host.pins[g]) for g in layout}
        if here == layout:
            continue
        label = ("exact layout of a host in back-off (its planned layouts measured worse lately)"
                 if name in inputs.history.held else "exact layout whose predicted gain the model's confidence declined")
        found = compare_layout(draft, inputs, host, layout, "relayout")  # its predicted gain: its promise
        offer_trial(draft, inputs, name, {"here": layout_key(name, here)}, "here", layout, TrialKind.EXACT, label,
                    value=0.0 if found is None else -found[0])


def keep_what_measured_better(draft: Draft, inputs: PlanInputs) -> bool:
    """A host whose plan leads to a layout an earlier trial measured worse than where it is now
    stays where it is (the planned moves were undone then, and the model has not learned why)."""
    changed = False
    for name, guests in sorted(draft.layout_guests.items()):
        host = draft.hosts[name]
        start = {g: dict(inputs.original[g].placement.vcpupin) for g in guests}
        here = layout_key(name, start)
        there = layout_key(name, {g: dict(host.pins[g]) for g in guests})
        if here == there or (here, there) not in inputs.history.measured_better:
            continue
        found = compare_layout(draft, inputs, host, start, "stay")
        if found is None:
            continue
        _, _, move = found
        move.reason = f"{name} stays as it is: the planned layout measured worse than this one in an earlier trial"
        take_move(draft, inputs, move)
        _restore_modes(draft, inputs, host, guests)
        draft.trials.pop(name, None)
        draft.ruled.add(name)
        draft.pessimistic.append({"host": name, "kept": "start (measured better than the planned layout)"})
        _offer_exact_from_start(draft, inputs, name, start, here, there)
        changed = True
    return changed


def _offer_exact_from_start(draft: Draft, inputs: PlanInputs, name: str, start: dict[str, dict[int, frozenset[int]]],
                            here: str, there: str) -> None:
    """The exact solver started from the climb's layout and was judged against it; once that
    layout is known to measure worse and the host stays, the solver's own layout is judged from
    where the host stays: worth `min_gain` by the model, it becomes the host's trial (measured,
    kept only if better), unless it is the layout measured worse or was measured already."""
    solved = draft.exact_layouts.get(name)
    host = draft.hosts[name]
    if not inputs.settings.trials or solved is None or any(g not in start for g in solved):
        return
    layout = {g: dict(solved.get(g, pins)) for g, pins in start.items()}  # keyed as `here` and `there`
    if layout_key(name, layout) == there:
        return
    found = compare_layout(draft, inputs, host, layout, "relayout")
    if found is None or -found[0] < min_gain_on(draft, inputs, [name]):
        return
    offer_trial(draft, inputs, name, {"here": here}, "here", layout, TrialKind.EXACT,
                f"exact layout (predicted {-found[0]:+.3f} from where {name} stays)", value=-found[0])


def _restore_modes(draft: Draft, inputs: PlanInputs, host: HostLayout, guests) -> None:
    """Guests the search pooled are pinned again, as they started."""
    for guest in guests:
        if draft.guests[guest].mode != inputs.original[guest].mode:
            draft.guests[guest] = replace(draft.guests[guest], mode=inputs.original[guest].mode)
            host.guests[guest] = draft.guests[guest]


def offer_trial(draft: Draft, inputs: PlanInputs, host: str, keys: dict[str, str], at: str,
                layout: dict[str, dict[int, frozenset[int]]], kind: TrialKind, label: str,
                budget: int | None = None, value: float = 0.0) -> None:
    """Note the layout to try after the plan's moves, unless a measurement already compared it with
    the one the host ends at (either way round) or the host tried `budget` layouts lately (default
    `trial_max`). `value`: what the trial promises, in objective units (core/rebalance/disruption)."""
    if inputs.history.tried.get(host, 0) >= (inputs.settings.trial_max if budget is None else budget):
        return  # enough tried on this host lately: the model learns from what was measured
    here, there = keys[at], layout_key(host, layout)
    if here == there or (here, there) in inputs.history.measured_better or (there, here) in inputs.history.measured_better:
        return
    if kind is TrialKind.SPREAD and any(loser == there for _, loser in inputs.history.measured_better):
        return  # the spread measured worse than the model's layout lately: the model's later layouts keep it
    draft.trials[host] = HostTrial(host, {g: dict(p) for g, p in layout.items()}, kind, label, here, there,
                                   max(float(value), 0.0))


def compare_layout(draft: Draft, inputs: PlanInputs, host: HostLayout, layout: dict[str, dict[int, frozenset[int]]],
                   kind: str) -> tuple[float, float, object] | None:
    """(the model's advantage of the host as it is over `layout`, its standard deviation, the move
    to `layout`); None when `layout` is where the host is or breaks a rule."""
    current = {g: dict(host.pins[g]) for g in layout}
    changes = [(g, host.name, pins) for g, pins in layout.items() if current[g] != pins]
    if not changes:
        return None
    move = new_move(kind, changes)
    before, before_lin = host_objective(inputs, host), linear_objective(inputs, host)
    undo = try_move(draft, move)
    try:
        after, after_lin = host_objective(inputs, host), linear_objective(inputs, host)
        broken = violations(draft, host, list(layout)) or not floors_hold(draft, inputs, host)
    finally:
        undo()
    if broken:
        return None
    move.gain, move.linear_gain = after - before, after_lin - before_lin
    return before - after, doubt(draft, inputs, move), move


def _sure_from_start(draft: Draft, inputs: PlanInputs, host: HostLayout, layout: dict[str, dict[int, frozenset[int]]]) -> float:
    """The sure gain of going from the guests' starting pins straight to `layout`."""
    current = {g: dict(host.pins[g]) for g in host.guests}
    start = {g: dict(inputs.original[g].placement.vcpupin) for g in layout}
    for g, pins in start.items():
        host.set_pins(g, pins)
    try:
        move = new_move("spread", [(g, host.name, pins) for g, pins in layout.items() if start[g] != pins])
        if not move.changes:
            return 0.0
        before, before_lin = host_objective(inputs, host), linear_objective(inputs, host)
        undo = try_move(draft, move)
        try:
            after, after_lin = host_objective(inputs, host), linear_objective(inputs, host)
        finally:
            undo()
        move.gain, move.linear_gain = after - before, after_lin - before_lin
        return judge(draft, inputs, move)
    finally:
        for g, pins in current.items():
            host.set_pins(g, pins)
