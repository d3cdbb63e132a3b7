"""From the search's moves to a plan's ordered actions.

The search records moves as it finds them (one guest may move several
times); a plan needs one action per operation on a host, in an order the
executor can follow: migrations first, then the repin on arrival and the
memory after the vCPUs; floating guests narrowed when their shared pool
shrinks; exclusive guests waiting for the pCPUs they take; and a
Freeze'nSense probe when the model's confidence in the moves is low.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
import functools
from dataclasses import replace
from typing import Any

from vmplacer.core.placement.allocate import refresh_shared_pins
from vmplacer.core.model.interference import InterferenceModel
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan, initial_state
from vmplacer.core.rebalance.layout import HostLayout, layout_confidences
from vmplacer.core.rebalance.draft import Draft, PlanInputs
from vmplacer.core.rebalance.whatif import EPS, current_placement, guest_confidence, perf_by_guest, relocated_cells
from vmplacer.core.rebalance.state import EXCLUSIVE, FLOATING
from vmplacer.core.rebalance.trial import hosts_key, layout_key


def _new_emulator(old: Placement, new_pins: Mapping[int, frozenset[int]], mode: str,
                  owned_by_others: frozenset[int]) -> frozenset[int]:
    """Emulator threads follow the vCPUs when they did (the engine's default), else stay."""
    old_cpus = old.pcpus
    new_cpus = frozenset().union(*new_pins.values()) if new_pins else frozenset()
    emulator = old.emulatorpin
    if emulator and (emulator == old_cpus or (mode == EXCLUSIVE and emulator <= old_cpus)):
        emulator = new_cpus
    if emulator & owned_by_others:
        emulator = (emulator - owned_by_others) or new_cpus
    return emulator


def _with_pins(draft: Draft, inputs: PlanInputs, name: str, host: HostLayout, pins: Mapping[int, frozenset[int]],
               base: Placement) -> Placement:
    guest = draft.guests[name]
    emulator = _new_emulator(base, pins, guest.mode, host.owned_by_others(name))
    placement = replace(base, host=host.name, vcpupin=dict(sorted(pins.items())), emulatorpin=emulator)
    if guest.mode == EXCLUSIVE:
        cpus = frozenset().union(*pins.values())
        if guest.thread_policy == "isolate":
            cpus = frozenset().union(*(host.siblings[c] for c in cpus))
        placement = replace(placement, exclusive_cpus=cpus, dedicated=True)
    return placement


def build_actions(draft: Draft, inputs: PlanInputs, model: InterferenceModel) -> tuple[list[Action], dict[str, dict[str, float]]]:
    settings = inputs.settings
    end_perf = perf_by_guest(draft)
    gains: dict[str, float] = {}
    linear: dict[str, float] = {}
    reasons: dict[str, list[str]] = {}
    costs: dict[str, dict[str, float]] = {}
    for move in draft.moves:
        share = 1.0 / len(move.changes)
        for change in move.changes:
            gains[change.guest] = gains.get(change.guest, 0.0) + move.gain * share
            linear[change.guest] = linear.get(change.guest, 0.0) + move.linear_gain * share
            reasons.setdefault(change.guest, []).append(move.reason)
            if move.cost:
                costs[change.guest] = dict(move.cost)
    if model is inputs.model:
        confidence_of = functools.partial(guest_confidence, draft, inputs)
    else:
        confidence_of = _confidences(draft, inputs, model).get

    actions: list[Action] = []
    def add(**kwargs) -> Action:
        action = Action(index=len(actions), **kwargs)
        actions.append(action)
        return action

    def action_confidence(name: str) -> float:
        total, lin = gains.get(name, 0.0), linear.get(name, 0.0)
        rest = abs(total - lin)
        if abs(lin) + rest <= EPS:
            return 1.0
        return float(min(1.0, max(0.0, (abs(lin) + confidence_of(name, 0.0) * rest) / (abs(lin) + rest))))

    order: dict[str, None] = {}  # the guests moved, in the order of their first move
    for move in draft.moves:
        for change in move.changes:
            order.setdefault(change.guest, None)
    migrations_first = [n for n in order if n in draft.migrated] + [n for n in order if n not in draft.migrated]
    for name in migrations_first:
        original = inputs.original[name].placement
        host = draft.hosts[draft.host_of[name]]
        final = _with_pins(draft, inputs, name, host, host.pins[name], original)
        if draft.memory_nodes.get(name) is not None:
            final = replace(final, memory_nodes=draft.memory_nodes[name],
                            cells=relocated_cells(original, draft.memory_nodes[name]))
        engine = next((c.placement for m in draft.moves for c in m.changes
                       if c.guest == name and c.placement is not None), None)
        if engine is not None and final.host == engine.host:
            final = replace(engine, vcpupin=dict(sorted(host.pins[name].items())))
        text = "; ".join(reasons.get(name, []))
        gain = gains.get(name, 0.0)
        conf = action_confidence(name)
        if name in draft.migrated:
            arrived = replace(original, host=final.host)
            add(kind="migrate", host=original.host, target_host=final.host, guest=name, before=original,
                after=arrived, reason=text, predicted_gain=gain, cost=costs.get(name, {}), confidence=conf)
            previous = arrived
            first = len(actions) - 1
            if (previous.vcpupin, previous.emulatorpin) != (final.vcpupin, final.emulatorpin):
                add(kind="repin", host=final.host, guest=name, before=previous,
                    after=replace(previous, vcpupin=final.vcpupin, emulatorpin=final.emulatorpin,
                                  exclusive_cpus=final.exclusive_cpus, dedicated=final.dedicated),
                    reason=f"pin {name} on arrival", predicted_gain=0.0, confidence=conf, depends_on=(first,))
                previous = actions[-1].after
            if previous.memory_nodes != final.memory_nodes and final.memory_nodes:
                add(kind="set_memory_nodes", host=final.host, guest=name, before=previous,
                    after=replace(previous, memory_nodes=final.memory_nodes, cells=final.cells),
                    reason=f"memory of {name} follows its vCPUs", confidence=conf,
                    depends_on=(len(actions) - 1,))
            continue
        pinned = replace(original, vcpupin=final.vcpupin, emulatorpin=final.emulatorpin,
                         exclusive_cpus=final.exclusive_cpus, dedicated=final.dedicated)
        if (original.vcpupin, original.emulatorpin) != (pinned.vcpupin, pinned.emulatorpin):
            add(kind="repin", host=original.host, guest=name, before=original, after=pinned, reason=text,
                predicted_gain=gain, cost=costs.get(name, {}), confidence=conf)
            gain = 0.0
        if name in draft.memory_moved and final.memory_nodes != original.memory_nodes:
            previous = actions[-1].after if actions and actions[-1].guest == name else original
            deps = (len(actions) - 1,) if actions and actions[-1].guest == name else ()
            add(kind="set_memory_nodes", host=original.host, guest=name, before=previous,
                after=replace(previous, memory_nodes=final.memory_nodes, cells=final.cells),
                reason=f"memory of {name} follows its vCPUs", predicted_gain=gain,
                cost=costs.get(name, {}), confidence=conf, depends_on=deps)

    actions = _narrow_floating(draft, inputs, actions)
    actions = _exclusive_dependencies(actions)
    affected = [n for n in draft.guests
                if n in order or abs(inputs.start_perf.get(n, 0.0) - end_perf.get(n, 0.0)) > 1e-9]
    predicted = {name: {"before": inputs.start_perf.get(name, 0.0), "after": end_perf.get(name, 0.0)}
                 for name in sorted(affected)}
    migrated_hosts = {a.host for a in actions if a.kind == "migrate"} | {a.target_host for a in actions
                                                                           if a.kind == "migrate"}
    low = bool(actions) and min(a.confidence for a in actions) < settings.probe_below_confidence
    hosts = sorted({a.target_host or a.host for a in actions} | (set(draft.trials) if settings.trials else set()))
    baselines: list[str] = []
    # migrations that rest on the model's data are measured too: their hosts together, so the
    # guests that moved count on both sides, and undone (migrated back) if they measured worse
    measured_groups = [group for group in _migration_groups(actions)
                       if settings.trials and not inputs.betas.empty and not set(group) & draft.ruled]
    for group in measured_groups:
        deps = tuple(a.index for a in actions if a.host in group or a.target_host in group)
        actions.append(_migration_trial_probe(draft, inputs, group, len(actions), deps))
        baselines.extend(group)
    jointly_measured = {host for group in measured_groups for host in group}
    index = _ActionIndex()
    for host in hosts:
        if host in jointly_measured:
            continue
        index.catch_up(actions)
        deps = tuple(index.on_host.get(host, ()))
        # moves that rest on the model's data are measured (time sharing alone is arithmetic; the
        # blind spread, or staying, is the rule the trial is measured against, not a guess)
        rests_on_data = not inputs.betas.empty and host not in draft.ruled
        if settings.trials and host not in migrated_hosts and (host in draft.trials or (deps and (low or rests_on_data))):
            confirm = bool(deps) and host not in draft.ruled
            if confirm or (host in draft.trials and not deps):
                baselines.append(host)  # the layout the next probe is compared with is the host as it is
            if confirm:
                actions.append(_trial_probe(draft, inputs, host, len(actions), deps, "confirm"))
            elif deps:  # moves by rule (the blind spread): measured, so a trial after them compares with them
                actions.append(Action(index=len(actions), kind="probe", host=host, depends_on=deps,
                                      reason="measure the host after these moves with Freeze'nSense, to compare "
                                             "the trial with",
                                      parameters={"seconds": settings.trial_seconds}))
            if host in draft.trials:
                index.catch_up(actions)
                _add_trial(draft, inputs, host, actions, index)
        elif deps and low:
            actions.append(Action(index=len(actions), kind="probe", host=host,
                                  reason="measure the new layout with Freeze'nSense: the model's confidence "
                                         "in these moves is low",
                                  depends_on=deps, parameters={"seconds": settings.probe_seconds}))
    if settings.trials:
        for label in sorted(draft.group_trials):
            trial = draft.group_trials[label]
            baselines.extend(h for h in trial["hosts"] if h not in baselines)
            _add_group_trial(draft, inputs, trial, actions)
    return _with_baselines(draft, inputs, actions, baselines), predicted


def _with_baselines(draft: Draft, inputs: PlanInputs, actions: list[Action], hosts: list[str]) -> list[Action]:
    """First, a probe of each host with a trial as it is: a trial compares two measurements, and
    the one before the moves should be as long as the one after (it pools with the run's profile).
    It runs before them (actions run in order) without holding them: with no profiler they still run."""
    if not hosts:
        return actions
    shift = len(hosts)
    first = [Action(index=i, kind="probe", host=host,
                    reason="measure the host as it is with Freeze'nSense, to compare the moves with",
                    parameters={"seconds": inputs.settings.trial_seconds, "baseline": True})
             for i, host in enumerate(hosts)]
    return first + [_shifted(action, shift) for action in actions]


def _shifted(action: Action, shift: int) -> Action:
    """`action` `shift` places later, its dependencies with it. Its checks (`Action.__post_init__`)
    do not depend on where it stands, so it is copied rather than built and checked again: a
    fleet's plan holds tens of thousands of actions."""
    moved = copy.copy(action)
    object.__setattr__(moved, "index", action.index + shift)
    object.__setattr__(moved, "depends_on", tuple(sorted({d + shift for d in action.depends_on})))
    return moved


def _layout_guests(draft: Draft, inputs: PlanInputs, host: HostLayout) -> list[str]:
    """The guests whose layout a trial names: the blind spread's (movable, pinned one vCPU to one
    pCPU), else every guest so pinned."""
    if host.name in draft.layout_guests:
        return draft.layout_guests[host.name]
    return sorted(g for g in host.guests if host.pins[g] and all(len(p) == 1 for p in host.pins[g].values()))


def _confirm_tolerance(draft: Draft, inputs: PlanInputs, hosts: list[str]) -> float:
    """How much worse a confirm trial of `hosts` may measure and still be kept: `trial_tolerance`,
    but where the model's last planned layout of one of them measured worse (refuted), the next
    must measure better by `trial_refuted_bar` (a negative tolerance). There the model was wrong
    lately, so "no worse" is no longer evidence enough: with one probe's error about 0.003 per
    guest, a plan truly 0.005 worse measures level often enough that, re-planned every run, one
    is kept within a few runs."""
    settings = inputs.settings
    if settings.trial_refuted_bar > 0 and inputs.history.refuted.intersection(hosts):
        return -settings.trial_refuted_bar
    return settings.trial_tolerance


def _confirm_rule(tolerance: float) -> str:
    """The confirm rule in words, for a probe's reason."""
    if tolerance < 0:
        return (f"the model's last planned layout here measured worse, so these moves are undone unless it "
                f"measures better by at least {-tolerance:g} per guest")
    return f"undo these moves if it measures worse by more than {tolerance:g} per guest"


def _trial_probe(draft: Draft, inputs: PlanInputs, host_name: str, index: int, deps: tuple[int, ...], kind: str,
                 reason: str = "", from_key: str = "", to_key: str = "") -> Action:
    """A probe that measures the host after `deps` and keeps or undoes them (core/rebalance/trial.py)."""
    settings = inputs.settings
    host = draft.hosts[host_name]
    guests = _layout_guests(draft, inputs, host)
    if not from_key:
        from_key = layout_key(host_name, {g: inputs.original[g].placement.vcpupin for g in guests})
        to_key = layout_key(host_name, {g: host.pins[g] for g in guests})
    tolerance = _confirm_tolerance(draft, inputs, [host_name])
    trial = {"kind": kind, "weights": {g: draft.guests[g].weight for g in sorted(host.guests)},
             "fairness": settings.fairness, "min_gain": settings.trial_min_gain,
             "tolerance": tolerance, "recheck": settings.trial_recheck,
             "from_key": from_key, "to_key": to_key}
    text = reason or f"measure the new layout with Freeze'nSense; {_confirm_rule(tolerance)}"
    return Action(index=index, kind="probe", host=host_name, reason=text, depends_on=deps,
                  parameters={"seconds": settings.trial_seconds, "trial": trial})


def _migration_groups(actions: list[Action]) -> list[list[str]]:
    """Hosts linked by the plan's migrations (source and destination, transitively), each group
    sorted; hosts no migration touches are in none."""
    group_of: dict[str, set[str]] = {}
    for action in actions:
        if action.kind != "migrate" or action.target_host is None:
            continue
        merged = group_of.get(action.host, {action.host}) | group_of.get(action.target_host, {action.target_host})
        for host in merged:
            group_of[host] = merged
    unique = {id(group): group for group in group_of.values()}
    return sorted(sorted(group) for group in unique.values())


def _migration_trial_probe(draft: Draft, inputs: PlanInputs, group: list[str], index: int, deps: tuple[int, ...]) -> Action:
    """A confirm probe after migrations: it measures every host in `group` and judges them as one
    (the guests that moved count with their measurements on both hosts); undone, the moves are
    reverted, the migrations by migrating back."""
    guests = [g for h in group for g in draft.hosts[h].guests]
    from_key = hosts_key(group, {g: (inputs.original[g].placement.host, inputs.original[g].placement.vcpupin)
                                 for g in guests})
    to_key = hosts_key(group, {g: (draft.host_of[g], draft.hosts[draft.host_of[g]].pins[g]) for g in guests})
    tolerance = _confirm_tolerance(draft, inputs, group)
    text = (f"measure {', '.join(group)} with Freeze'nSense after these migrations, judged together; "
            f"{_confirm_rule(tolerance)} (migrate back)")
    return _joint_probe(draft, inputs, group, index, deps, "confirm", from_key, to_key, text, tolerance)


def _joint_probe(draft: Draft, inputs: PlanInputs, group: list[str], index: int, deps: tuple[int, ...], kind: str,
                 from_key: str, to_key: str, text: str, tolerance: float | None = None) -> Action:
    """A trial probe of every host in `group`, judged as one, on the first host's name."""
    settings = inputs.settings
    tolerance = settings.trial_tolerance if tolerance is None else tolerance
    guests = sorted(g for h in group for g in draft.hosts[h].guests)
    trial = {"kind": kind, "hosts": list(group), "weights": {g: draft.guests[g].weight for g in guests},
             "fairness": settings.fairness, "min_gain": settings.trial_min_gain,
             "tolerance": tolerance, "recheck": settings.trial_recheck,
             "from_key": from_key, "to_key": to_key}
    return Action(index=index, kind="probe", host=group[0], reason=text, depends_on=deps,
                  parameters={"seconds": settings.trial_seconds, "trial": trial})


class _ActionIndex:
    """What the per-host steps of `build_actions` look up in the actions so far — each guest's
    latest action with a placement after it, each host's latest probe, the actions on each host —
    kept up to date by reading only the actions appended since the last look (a fleet's plan has
    tens of thousands of actions: a scan per host would make building it quadratic)."""

    def __init__(self) -> None:
        self.seen = 0
        self.last_after: dict[str, Action] = {}
        self.last_probe: dict[str, int] = {}
        self.on_host: dict[str, list[int]] = {}

    def catch_up(self, actions: list[Action]) -> None:
        for action in actions[self.seen:]:
            if action.guest is not None and action.after is not None:
                self.last_after[action.guest] = action
            if action.kind == "probe":
                self.last_probe[action.host] = action.index
            self.on_host.setdefault(action.target_host or action.host, []).append(action.index)
        self.seen = len(actions)


def _add_trial(draft: Draft, inputs: PlanInputs, host_name: str, actions: list[Action], index: _ActionIndex) -> None:
    """Repins from the plan's layout of the host to its trial layout, then an explore probe.
    `index` is up to date with `actions`."""
    trial = draft.trials[host_name]
    host = draft.hosts[host_name]
    last = index.last_after
    previous_probe = index.last_probe.get(host_name)
    first = len(actions)
    for name, pins in sorted(trial["layout"].items()):
        if dict(host.pins[name]) == pins:
            continue
        base = last[name].after if name in last else inputs.original[name].placement
        after = _with_pins(draft, inputs, name, host, pins, base)
        after = replace(base, vcpupin=after.vcpupin, emulatorpin=after.emulatorpin)
        actions.append(Action(index=len(actions), kind="repin", host=host_name, guest=name, before=base,
                              after=after, reason=f"trial of the {trial['label']} on {host_name}",
                              confidence=0.0, depends_on=() if previous_probe is None else (previous_probe,),
                              parameters={"tried": trial["what"]}))
    deps = tuple(range(first, len(actions)))
    if not deps:
        return
    settings = inputs.settings
    reason = (f"measure the {trial['label']} with Freeze'nSense: kept only if it measures better than the "
              f"layout before it by at least {settings.trial_min_gain:g} per guest, else undone")
    actions.append(_trial_probe(draft, inputs, host_name, len(actions), deps, "explore", reason,
                                trial["from_key"], trial["to_key"]))


def _add_group_trial(draft: Draft, inputs: PlanInputs, trial: dict, actions: list[Action]) -> None:
    """Migrations (each with its repin on arrival) and repins to a joint layout of small hosts,
    then an explore probe that measures every host of the group and judges them as one."""
    group = trial["hosts"]
    first = len(actions)
    tag = {"tried": trial["what"]}
    reason = f"trial of the {trial['label']}"
    moving = sorted(trial["changes"].items(), key=lambda item: (item[1][0] == draft.host_of[item[0]], item[0]))
    for name, (target, pins) in moving:  # migrations first, as in a plan
        base = current_placement(draft, name)
        host = draft.hosts[target]
        placed = _with_pins(draft, inputs, name, host, pins, base)
        if target != base.host:
            arrived = replace(base, host=target)
            actions.append(Action(index=len(actions), kind="migrate", host=base.host, target_host=target, guest=name,
                                  before=base, after=arrived, reason=reason, confidence=0.0, parameters=tag))
            migrated = len(actions) - 1
            actions.append(Action(index=len(actions), kind="repin", host=target, guest=name, before=arrived,
                                  after=replace(arrived, vcpupin=placed.vcpupin, emulatorpin=placed.emulatorpin),
                                  reason=f"pin {name} on arrival", confidence=0.0, depends_on=(migrated,),
                                  parameters=tag))
        else:
            actions.append(Action(index=len(actions), kind="repin", host=target, guest=name, before=base,
                                  after=replace(base, vcpupin=placed.vcpupin, emulatorpin=placed.emulatorpin),
                                  reason=reason, confidence=0.0, parameters=tag))
    deps = tuple(range(first, len(actions)))
    if not deps:
        return
    text = (f"measure {', '.join(group)} with Freeze'nSense: the {trial['label']} is kept only if the hosts together "
            f"measure better than before by at least {inputs.settings.trial_min_gain:g} per guest, else undone "
            "(the guests migrate back)")
    actions.append(_joint_probe(draft, inputs, group, len(actions), deps, "explore", trial["from_key"], trial["to_key"], text))


def _narrow_floating(draft: Draft, inputs: PlanInputs, actions: list[Action]) -> list[Action]:
    """Floating guests leave pCPUs that exclusive guests now own (refresh_shared_pins)."""
    result = list(actions)
    touched_hosts = {a.target_host or a.host for a in actions
                     if a.after is not None and (a.after.exclusive_cpus or a.before.exclusive_cpus)}
    for name in sorted(touched_hosts):
        host = draft.hosts[name]
        current = [_current_for_refresh(draft, inputs, n) for n in host.guests]
        for before, after in zip(current, refresh_shared_pins(host.topology, current)):
            if before == after or draft.guests[before.guest].mode != FLOATING:
                continue
            if any(a.guest == before.guest for a in result):
                continue
            deps = tuple(a.index for a in result if (a.target_host or a.host) == name)
            result.append(Action(index=len(result), kind="repin", host=name, guest=before.guest,
                                 before=inputs.original[before.guest].placement,
                                 after=replace(inputs.original[before.guest].placement, vcpupin=after.vcpupin,
                                               emulatorpin=after.emulatorpin),
                                 reason="its shared pool shrank: pCPUs became exclusive to another guest",
                                 depends_on=deps))
    return result


def _current_for_refresh(draft: Draft, inputs: PlanInputs, name: str) -> Placement:
    guest = draft.guests[name]
    host = draft.hosts[draft.host_of[name]]
    placement = current_placement(draft, name)
    if guest.mode == EXCLUSIVE:
        return _with_pins(draft, inputs, name, host, host.pins[name], placement)
    return replace(placement, exclusive_cpus=frozenset(), dedicated=False)


def _exclusive_dependencies(actions: list[Action]) -> list[Action]:
    """An exclusive guest moving onto pCPUs another action vacates waits for that action."""
    result = []
    for action in actions:
        deps = set(action.depends_on)
        if action.kind == "repin" and action.after is not None and action.after.exclusive_cpus:
            host = action.host
            target = action.after.exclusive_cpus
            for earlier in result:
                if earlier.guest == action.guest or earlier.kind not in ("repin", "migrate"):
                    continue
                if earlier.host == host and earlier.before is not None and earlier.before.pcpus & target:
                    deps.add(earlier.index)
        result.append(replace(action, depends_on=tuple(sorted(deps))))
    return result


def _confidences(draft: Draft, inputs: PlanInputs, model: InterferenceModel) -> dict[str, float]:
    """The model's confidence in each guest's prediction in the final layout."""
    result: dict[str, float] = {}
    for host in draft.hosts.values():
        result.update(layout_confidences(host, model, inputs.betas))
    return result


def plan_from_search(draft: Draft, inputs: PlanInputs, actions: list[Action], predicted: dict[str, dict[str, float]], *,
                     before: float, after: float, summary: str, notes: dict[str, Any],
                     now: float | None) -> Plan:
    """The Plan of a finished search: its actions, the objective before and after, and why."""
    return Plan(
        actions=tuple(actions),
        hosts=tuple(sorted(inputs.state.hosts)),
        state=initial_state(actions),
        objective_before=before,
        objective_after=after,
        predicted=predicted,
        summary=summary,
        settings={**inputs.settings.to_dict(), "notes": notes},
        created_at=now,
    )
