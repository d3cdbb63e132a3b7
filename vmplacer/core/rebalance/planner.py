"""From the stages' outputs to a plan's ordered actions.

The stages leave the moves they took (one guest may move several times) and the trials they
offer (core/rebalance/offers.py); a plan needs one action per operation on a host, in an order
the executor can follow: migrations first, then the repin on arrival and the memory after the
vCPUs; floating guests narrowed when their shared pool shrinks; exclusive guests waiting for the
pCPUs they take; a Freeze'nSense probe when the model's confidence in the moves is low; moves
that rest on the model's data measured (confirm trials, migrations judged with both hosts); the
offered trials after them; and first a baseline probe of every host a trial compares with.

The planner reads only `PlannerInput`: the moves and offers, which hosts a rule decided, the
settings, and a read-only `PlanView` of where the moves leave each guest (the what-if state
behind it is the stages' business, core/rebalance/actions.py builds the view). It decides
nothing about layouts: it sequences what the stages decided.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.offers import GroupTrial, HostTrial, Pins
from vmplacer.core.rebalance.plan import Action
from vmplacer.core.rebalance.state import RebalanceSettings
from vmplacer.core.rebalance.trial import hosts_key, layout_key
from vmplacer.core.rebalance.whatif import EPS, CandidateMove


class PlanView(Protocol):
    """Where the plan's moves leave each guest and host, read-only."""

    def original(self, guest: str) -> Placement:
        """The guest's placement as the run found it."""

    def current(self, guest: str) -> Placement:
        """The guest's placement as the moves leave it (host, pins, memory nodes)."""

    def final(self, guest: str) -> Placement:
        """What a moved guest's actions must produce: its pins with its emulator threads and
        exclusive pCPUs as the placement engine writes them, memory and cells where they moved."""

    def placed(self, guest: str, host: str, pins: Pins, base: Placement) -> Placement:
        """`base` pinned to `pins` on `host`, emulator threads and exclusive pCPUs following."""

    def host_of(self, guest: str) -> str:
        """The host the moves leave the guest on."""

    def pins(self, guest: str) -> Pins:
        """The guest's pins as the moves leave them."""

    def host_guests(self, host: str) -> Sequence[str]:
        """The guests on `host` once the moves are done."""

    def weight(self, guest: str) -> float:
        """The guest's weight in the objective."""

    def layout_guests(self, host: str) -> Sequence[str]:
        """The guests a trial of `host` names in its layout keys."""

    def confidence(self, guest: str) -> float:
        """The model's confidence in the guest's predicted performance where the moves leave it."""

    def narrowed_floating(self, host: str) -> Sequence[tuple[str, Placement]]:
        """Floating guests of `host` whose shared pool shrinks (pCPUs became exclusive), each
        with the pins and emulator threads it narrows to (on its placement as found)."""


@dataclass(frozen=True)
class PlannerInput:
    """What the planner is given: the stages' outputs and the settings, nothing else."""

    moves: Sequence[CandidateMove]  # the moves taken, in order
    migrated: frozenset[str]  # guests the moves took to another host
    memory_moved: frozenset[str]  # guests whose memory moves within their host
    trials: Mapping[str, HostTrial]  # host -> its trial, within the disruption budget
    group_trials: Mapping[str, GroupTrial]  # "h1+h2" -> small hosts' joint trial
    ruled: frozenset[str]  # hosts a rule decided (the blind spread, or kept as they are)
    rests_on_data: bool  # the model has learned coefficients (moves may rest on them)
    refuted: frozenset[str]  # hosts whose planned layouts measured worse lately
    settings: RebalanceSettings
    view: PlanView


def moved_in_order(moves: Sequence[CandidateMove]) -> list[str]:
    """The guests the moves changed, in the order of their first move."""
    order: dict[str, None] = {}
    for move in moves:
        for change in move.changes:
            order.setdefault(change.guest, None)
    return list(order)


def plan_actions(given: PlannerInput) -> list[Action]:
    """The plan's ordered actions (module docstring)."""
    actions = _move_actions(given, _Attribution.of(given.moves))
    actions = _narrow_floating(given.view, actions)
    actions = _exclusive_dependencies(actions)
    return _with_trials(given, actions)


@dataclass(frozen=True)
class _Attribution:
    """What the moves give each guest they change: its share of their gains, their reasons, the
    cost of its last costly move."""

    gains: Mapping[str, float]
    linear: Mapping[str, float]  # the part of the gain time sharing alone explains
    reasons: Mapping[str, list[str]]
    costs: Mapping[str, dict[str, float]]

    @classmethod
    def of(cls, moves: Sequence[CandidateMove]) -> _Attribution:
        gains: dict[str, float] = {}
        linear: dict[str, float] = {}
        reasons: dict[str, list[str]] = {}
        costs: dict[str, dict[str, float]] = {}
        for move in moves:
            share = 1.0 / len(move.changes)
            for change in move.changes:
                gains[change.guest] = gains.get(change.guest, 0.0) + move.gain * share
                linear[change.guest] = linear.get(change.guest, 0.0) + move.linear_gain * share
                reasons.setdefault(change.guest, []).append(move.reason)
                if move.cost:
                    costs[change.guest] = dict(move.cost)
        return cls(gains, linear, reasons, costs)


def _move_actions(given: PlannerInput, attribution: _Attribution) -> list[Action]:
    """One action per operation of each moved guest, migrations first: a migration, its repin on
    arrival and its memory after; else a repin and the memory after it."""
    view = given.view
    gains, linear, reasons, costs = attribution.gains, attribution.linear, attribution.reasons, attribution.costs
    actions: list[Action] = []

    def add(**kwargs: Any) -> Action:
        action = Action(index=len(actions), **kwargs)
        actions.append(action)
        return action

    def action_confidence(name: str) -> float:
        total, lin = gains.get(name, 0.0), linear.get(name, 0.0)
        rest = abs(total - lin)
        if abs(lin) + rest <= EPS:
            return 1.0
        return float(min(1.0, max(0.0, (abs(lin) + view.confidence(name) * rest) / (abs(lin) + rest))))

    order = moved_in_order(given.moves)
    migrated = given.migrated
    migrations_first = [n for n in order if n in migrated] + [n for n in order if n not in migrated]
    for name in migrations_first:
        original = view.original(name)
        final = view.final(name)
        text = "; ".join(reasons.get(name, []))
        gain = gains.get(name, 0.0)
        conf = action_confidence(name)
        if name in migrated:
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
                after = actions[-1].after
                assert after is not None
                previous = after
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
        if name in given.memory_moved and final.memory_nodes != original.memory_nodes:
            latest = actions[-1].after if actions and actions[-1].guest == name else None
            base = latest if latest is not None else original
            deps = (len(actions) - 1,) if latest is not None else ()
            add(kind="set_memory_nodes", host=original.host, guest=name, before=base,
                after=replace(base, memory_nodes=final.memory_nodes, cells=final.cells),
                reason=f"memory of {name} follows its vCPUs", predicted_gain=gain,
                cost=costs.get(name, {}), confidence=conf, depends_on=deps)
    return actions


def _with_trials(given: PlannerInput, actions: list[Action]) -> list[Action]:
    """The moves' actions followed by the probes that measure them and the offered trials, the
    baseline probes first."""
    settings = given.settings
    ruled = given.ruled
    migrated_hosts = {a.host for a in actions if a.kind == "migrate"} | {a.target_host for a in actions
                                                                           if a.kind == "migrate"}
    low = bool(actions) and min(a.confidence for a in actions) < settings.probe_below_confidence
    hosts = sorted({a.target_host or a.host for a in actions} | (set(given.trials) if settings.trials else set()))
    baselines: list[str] = []
    # migrations that rest on the model's data are measured too: their hosts together, so the
    # guests that moved count on both sides, and undone (migrated back) if they measured worse
    measured_groups = [group for group in _migration_groups(actions)
                       if settings.trials and given.rests_on_data and not set(group) & ruled]
    for group in measured_groups:
        deps = tuple(a.index for a in actions if a.host in group or a.target_host in group)
        actions.append(_migration_trial_probe(given, group, len(actions), deps))
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
        rests_on_data = given.rests_on_data and host not in ruled
        if (settings.trials and host not in migrated_hosts
                and (host in given.trials or (deps and (low or rests_on_data)))):
            confirm = bool(deps) and host not in ruled
            if confirm or (host in given.trials and not deps):
                baselines.append(host)  # the layout the next probe is compared with is the host as it is
            if confirm:
                actions.append(_trial_probe(given, host, len(actions), deps, "confirm"))
            elif deps:  # moves by rule (the blind spread): measured, so a trial after them compares with them
                actions.append(Action(index=len(actions), kind="probe", host=host, depends_on=deps,
                                      reason="measure the host after these moves with Freeze'nSense, to compare "
                                             "the trial with",
                                      parameters={"seconds": settings.trial_seconds}))
            if host in given.trials:
                index.catch_up(actions)
                _add_trial(given, given.trials[host], actions, index)
        elif deps and low:
            actions.append(Action(index=len(actions), kind="probe", host=host,
                                  reason="measure the new layout with Freeze'nSense: the model's confidence "
                                         "in these moves is low",
                                  depends_on=deps, parameters={"seconds": settings.probe_seconds}))
    if settings.trials:
        for label in sorted(given.group_trials):
            trial = given.group_trials[label]
            baselines.extend(h for h in trial.hosts if h not in baselines)
            _add_group_trial(given, trial, actions)
    return _with_baselines(settings, actions, baselines)


def _with_baselines(settings: RebalanceSettings, actions: list[Action], hosts: list[str]) -> list[Action]:
    """First, a probe of each host with a trial as it is: a trial compares two measurements, and
    the one before the moves should be as long as the one after (it pools with the run's profile).
    It runs before them (actions run in order) without holding them: with no profiler they still run."""
    if not hosts:
        return actions
    shift = len(hosts)
    first = [Action(index=i, kind="probe", host=host,
                    reason="measure the host as it is with Freeze'nSense, to compare the moves with",
                    parameters={"seconds": settings.trial_seconds, "baseline": True})
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


def _confirm_tolerance(given: PlannerInput, hosts: list[str]) -> float:
    """How much worse a confirm trial of `hosts` may measure and still be kept: `trial_tolerance`,
    but where the model's last planned layout of one of them measured worse (refuted), the next
    must measure better by `trial_refuted_bar` (a negative tolerance). There the model was wrong
    lately, so "no worse" is no longer evidence enough: with one probe's error about 0.003 per
    guest, a plan truly 0.005 worse measures level often enough that, re-planned every run, one
    is kept within a few runs."""
    settings = given.settings
    if settings.trial_refuted_bar > 0 and given.refuted.intersection(hosts):
        return -settings.trial_refuted_bar
    return settings.trial_tolerance


def _confirm_rule(tolerance: float) -> str:
    """The confirm rule in words, for a probe's reason."""
    if tolerance < 0:
        return (f"the model's last planned layout here measured worse, so these moves are undone unless it "
                f"measures better by at least {-tolerance:g} per guest")
    return f"undo these moves if it measures worse by more than {tolerance:g} per guest"


def _trial_probe(given: PlannerInput, host: str, index: int, deps: tuple[int, ...], kind: str,
                 reason: str = "", from_key: str = "", to_key: str = "") -> Action:
    """A probe that measures the host after `deps` and keeps or undoes them (core/rebalance/trial.py)."""
    settings, view = given.settings, given.view
    if not from_key:
        guests = view.layout_guests(host)
        from_key = layout_key(host, {g: view.original(g).vcpupin for g in guests})
        to_key = layout_key(host, {g: view.pins(g) for g in guests})
    tolerance = _confirm_tolerance(given, [host])
    trial = {"kind": kind, "weights": {g: view.weight(g) for g in sorted(view.host_guests(host))},
             "fairness": settings.fairness, "min_gain": settings.trial_min_gain,
             "tolerance": tolerance, "recheck": settings.trial_recheck,
             "from_key": from_key, "to_key": to_key}
    text = reason or f"measure the new layout with Freeze'nSense; {_confirm_rule(tolerance)}"
    return Action(index=index, kind="probe", host=host, reason=text, depends_on=deps,
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


def _migration_trial_probe(given: PlannerInput, group: list[str], index: int, deps: tuple[int, ...]) -> Action:
    """A confirm probe after migrations: it measures every host in `group` and judges them as one
    (the guests that moved count with their measurements on both hosts); undone, the moves are
    reverted, the migrations by migrating back."""
    view = given.view
    guests = [g for h in group for g in view.host_guests(h)]
    from_key = hosts_key(group, {g: (view.original(g).host, view.original(g).vcpupin) for g in guests})
    to_key = hosts_key(group, {g: (view.host_of(g), view.pins(g)) for g in guests})
    tolerance = _confirm_tolerance(given, group)
    text = (f"measure {', '.join(group)} with Freeze'nSense after these migrations, judged together; "
            f"{_confirm_rule(tolerance)} (migrate back)")
    return _joint_probe(given, group, index, deps, "confirm", from_key, to_key, text, tolerance)


def _joint_probe(given: PlannerInput, group: list[str], index: int, deps: tuple[int, ...], kind: str,
                 from_key: str, to_key: str, text: str, tolerance: float | None = None) -> Action:
    """A trial probe of every host in `group`, judged as one, on the first host's name."""
    settings, view = given.settings, given.view
    tolerance = settings.trial_tolerance if tolerance is None else tolerance
    guests = sorted(g for h in group for g in view.host_guests(h))
    trial = {"kind": kind, "hosts": list(group), "weights": {g: view.weight(g) for g in guests},
             "fairness": settings.fairness, "min_gain": settings.trial_min_gain,
             "tolerance": tolerance, "recheck": settings.trial_recheck,
             "from_key": from_key, "to_key": to_key}
    return Action(index=index, kind="probe", host=group[0], reason=text, depends_on=deps,
                  parameters={"seconds": settings.trial_seconds, "trial": trial})


class _ActionIndex:
    """What the per-host steps of the planner look up in the actions so far — each guest's
    latest action with a placement after it, each host's latest probe, the actions on each host —
    kept up to date by reading only the actions appended since the last look (a fleet's plan has
    tens of thousands of actions: a scan per host would make building it quadratic)."""

    def __init__(self) -> None:
        self.seen = 0
        self.last_after: dict[str, Placement] = {}
        self.last_probe: dict[str, int] = {}
        self.on_host: dict[str, list[int]] = {}

    def catch_up(self, actions: list[Action]) -> None:
        for action in actions[self.seen:]:
            if action.guest is not None and action.after is not None:
                self.last_after[action.guest] = action.after
            if action.kind == "probe":
                self.last_probe[action.host] = action.index
            self.on_host.setdefault(action.target_host or action.host, []).append(action.index)
        self.seen = len(actions)


def _add_trial(given: PlannerInput, trial: HostTrial, actions: list[Action], index: _ActionIndex) -> None:
    """Repins from the plan's layout of the host to its trial layout, then an explore probe.
    `index` is up to date with `actions`."""
    view, host = given.view, trial.host
    previous_probe = index.last_probe.get(host)
    first = len(actions)
    for name, pins in sorted(trial.layout.items()):
        if dict(view.pins(name)) == pins:
            continue
        latest = index.last_after.get(name)
        base = latest if latest is not None else view.original(name)
        placed = view.placed(name, host, pins, base)
        after = replace(base, vcpupin=placed.vcpupin, emulatorpin=placed.emulatorpin)
        actions.append(Action(index=len(actions), kind="repin", host=host, guest=name, before=base,
                              after=after, reason=f"trial of the {trial.label} on {host}",
                              confidence=0.0, depends_on=() if previous_probe is None else (previous_probe,),
                              parameters={"tried": trial.kind.value}))
    deps = tuple(range(first, len(actions)))
    if not deps:
        return
    reason = (f"measure the {trial.label} with Freeze'nSense: kept only if it measures better than the "
              f"layout before it by at least {given.settings.trial_min_gain:g} per guest, else undone")
    actions.append(_trial_probe(given, host, len(actions), deps, "explore", reason, trial.from_key, trial.to_key))


def _add_group_trial(given: PlannerInput, trial: GroupTrial, actions: list[Action]) -> None:
    """Migrations (each with its repin on arrival) and repins to a joint layout of small hosts,
    then an explore probe that measures every host of the group and judges them as one."""
    view = given.view
    group = list(trial.hosts)
    first = len(actions)
    tag = {"tried": trial.kind.value}
    reason = f"trial of the {trial.label}"
    moving = sorted(trial.changes.items(), key=lambda item: (item[1][0] == view.host_of(item[0]), item[0]))
    for name, (target, pins) in moving:  # migrations first, as in a plan
        base = view.current(name)
        placed = view.placed(name, target, pins, base)
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
    text = (f"measure {', '.join(group)} with Freeze'nSense: the {trial.label} is kept only if the hosts together "
            f"measure better than before by at least {given.settings.trial_min_gain:g} per guest, else undone "
            "(the guests migrate back)")
    actions.append(_joint_probe(given, group, len(actions), deps, "explore", trial.from_key, trial.to_key, text))


def _narrow_floating(view: PlanView, actions: list[Action]) -> list[Action]:
    """Floating guests leave pCPUs that exclusive guests now own (refresh_shared_pins)."""
    result = list(actions)
    touched_hosts = {a.target_host or a.host for a in actions
                     if a.after is not None and a.before is not None
                     and (a.after.exclusive_cpus or a.before.exclusive_cpus)}
    for host in sorted(touched_hosts):
        for guest, narrowed in view.narrowed_floating(host):
            if any(a.guest == guest for a in result):
                continue
            deps = tuple(a.index for a in result if (a.target_host or a.host) == host)
            result.append(Action(index=len(result), kind="repin", host=host, guest=guest,
                                 before=view.original(guest), after=narrowed,
                                 reason="its shared pool shrank: pCPUs became exclusive to another guest",
                                 depends_on=deps))
    return result


def _exclusive_dependencies(actions: list[Action]) -> list[Action]:
    """An exclusive guest moving onto pCPUs another action vacates waits for that action."""
    result: list[Action] = []
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
